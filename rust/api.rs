//! The functions `treeclone._native` exports; `treeclone.tree_util` wraps them.

use crate::keys::order;
use crate::registry::{self, compat};
use crate::traverse::plain::{check, check_arguments, flatten, static_positions};
use crate::traverse::Options;
use crate::treedef::{self, PyTreeDef};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PyTuple};

/// `(leaves, treedef)` of `tree`, as `jax.tree_util.tree_flatten`.
///
/// >>> import treeclone.tree_util as tu
/// >>> tu.tree_flatten({"b": (1, 2), "a": [3, None]})
/// ([3, 1, 2], PyTreeDef({'a': [*, None], 'b': (*, *)}))
#[pyfunction(name = "flatten")]
#[pyo3(signature = (tree, is_leaf=None))]
pub(crate) fn py_flatten<'py>(
    tree: &Bound<'py, PyAny>,
    is_leaf: Option<Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyTreeDef>)> {
    let py = tree.py();
    let out = flatten(tree, &Options::plain(is_leaf))?;
    Ok((
        PyList::new(py, out.leaves)?,
        Bound::new(py, PyTreeDef::new(out.nodes))?,
    ))
}

/// Raise what `flatten(tree)` would raise (a cycle, a bad flatten result), recording nothing;
/// `name` names the tree's root in a cycle's message.
#[pyfunction(name = "check")]
#[pyo3(signature = (tree, name=None))]
pub(crate) fn py_check(tree: &Bound<'_, PyAny>, name: Option<String>) -> PyResult<()> {
    let opts = Options {
        root_name: name,
        ..Options::default()
    };
    check(tree, &opts)
}

/// Raise what `check((args, kwargs))` would raise, the static arguments left out: positions
/// in `static_nums` (a negative one counts from the end) and keywords in `static_names`. The
/// clone policy's whole cost per call: one native call, with static arguments or without.
///
/// >>> from treeclone import _native
/// >>> loop = []
/// >>> loop.append(loop)
/// >>> _native.check_arguments((1, loop), {}, frozenset({-1}), frozenset())
/// >>> try:
/// ...     _native.check_arguments((1, loop), {}, frozenset(), frozenset())
/// ... except ValueError as e:
/// ...     print(e)
/// cycle detected in pytree: the list at key path [0][1] contains itself at relative key path [0] (treeclone docs: errors.html#cyclic-tree)
#[pyfunction(name = "check_arguments")]
pub(crate) fn py_check_arguments<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: &Bound<'py, PyDict>,
    static_nums: &Bound<'py, PyFrozenSet>,
    static_names: &Bound<'py, PyFrozenSet>,
) -> PyResult<()> {
    let static_nums = static_positions(static_nums)?;
    check_arguments(args, Some(kwargs), &static_nums, static_names)
}

/// Rebuild the tree of `treedef` (treeclone's or jaxlib's) from `leaves`; a jaxlib treedef
/// unflattens itself, as in JAX. A native function, so the call costs no Python frame.
///
/// >>> import treeclone.tree_util as tu
/// >>> tu.tree_unflatten(tu.tree_structure({"a": [0, 0], "b": None}), ["x", "y"])
/// {'a': ['x', 'y'], 'b': None}
#[pyfunction(name = "tree_unflatten")]
pub(crate) fn unflatten<'py>(
    treedef: &Bound<'py, PyAny>,
    leaves: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    match treedef.cast::<PyTreeDef>() {
        Ok(def) => def.get().unflatten(treedef.py(), leaves),
        Err(_) => treedef.call_method1(pyo3::intern!(treedef.py(), "unflatten"), (leaves,)),
    }
}

/// The leaves of `tree`, in JAX's order (dict keys sorted).
///
/// >>> import treeclone.tree_util as tu
/// >>> tu.tree_leaves({"b": (1, 2), "a": [3, None]})
/// [3, 1, 2]
#[pyfunction]
#[pyo3(signature = (tree, is_leaf=None))]
pub(crate) fn leaves<'py>(
    tree: &Bound<'py, PyAny>,
    is_leaf: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    PyList::new(tree.py(), flatten(tree, &Options::plain(is_leaf))?.leaves)
}

/// The treedef of `tree`.
///
/// >>> import treeclone.tree_util as tu
/// >>> tu.tree_structure({"a": [1, 2], "b": None})
/// PyTreeDef({'a': [*, *], 'b': None})
#[pyfunction]
#[pyo3(signature = (tree, is_leaf=None))]
pub(crate) fn structure<'py>(
    tree: &Bound<'py, PyAny>,
    is_leaf: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTreeDef>> {
    let nodes = flatten(tree, &Options::plain(is_leaf))?.nodes;
    Bound::new(tree.py(), PyTreeDef::new(nodes))
}

/// `([(key_path, leaf), ...], treedef)`, as `jax.tree_util.tree_flatten_with_path`.
#[pyfunction]
#[pyo3(signature = (tree, is_leaf=None, is_leaf_takes_path=false))]
pub(crate) fn flatten_with_path<'py>(
    tree: &Bound<'py, PyAny>,
    is_leaf: Option<Bound<'py, PyAny>>,
    is_leaf_takes_path: bool,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyTreeDef>)> {
    let py = tree.py();
    let opts = Options {
        is_leaf: is_leaf.filter(|f| !f.is_none()),
        is_leaf_takes_path,
        with_paths: true,
        root_name: None,
    };
    let out = flatten(tree, &opts)?;
    let pairs = out
        .paths
        .into_iter()
        .zip(out.leaves)
        .map(|(p, l)| PyTuple::new(py, [p.into_any(), l]))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((
        PyList::new(py, pairs)?,
        Bound::new(py, PyTreeDef::new(out.nodes))?,
    ))
}

/// `jax.tree_util.tree_map`: `f` over the leaves of `tree` and the matching subtrees of `rest`.
///
/// >>> import treeclone.tree_util as tu
/// >>> tu.tree_map(lambda x, y: x + y, [1, 2], [10, 20])
/// [11, 22]
#[pyfunction]
#[pyo3(signature = (f, tree, *rest, is_leaf=None))]
pub(crate) fn tree_map<'py>(
    f: &Bound<'py, PyAny>,
    tree: &Bound<'py, PyAny>,
    rest: &Bound<'py, PyTuple>,
    is_leaf: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = tree.py();
    let is_leaf = is_leaf.filter(|f| !f.is_none());
    let out = flatten(tree, &Options::plain(is_leaf.clone()))?;
    let treedef = PyTreeDef::new(out.nodes);
    let mut results: Vec<Py<PyAny>> = Vec::with_capacity(out.leaves.len());
    if rest.is_empty() {
        for leaf in &out.leaves {
            results.push(f.call1((leaf,))?.unbind());
        }
    } else {
        let mut others = Vec::with_capacity(rest.len());
        for other in rest.iter() {
            match treedef.flatten_up_to_vec(&other) {
                Ok(v) => others.push(v),
                Err(err) => {
                    let better = compat(py)?.prefix_error.bind(py).call1((
                        tree,
                        &other,
                        is_leaf.as_ref(),
                        err.value(py),
                        "tree_map tree",
                    ))?;
                    return Err(PyErr::from_value(better));
                }
            }
        }
        for (i, leaf) in out.leaves.iter().enumerate() {
            let mut args = Vec::with_capacity(others.len() + 1);
            args.push(leaf.clone());
            for o in &others {
                args.push(o[i].clone());
            }
            results.push(f.call1(PyTuple::new(py, args)?)?.unbind());
        }
    }
    treedef.unflatten_vec(py, results)
}

/// Whether `x` is a leaf (not a registered node, not None, not a container).
#[pyfunction]
pub(crate) fn is_leaf_object(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(matches!(registry::classify(x)?, registry::Kind::Leaf))
}

/// Forget cached type classifications (called after every registration through treeclone).
#[pyfunction]
pub(crate) fn invalidate_registry_cache() {
    registry::invalidate();
}

/// Forget cached dict key orders.
#[pyfunction]
pub(crate) fn clear_key_order_cache() {
    order::clear_cache();
    crate::node::memo::clear();
}

/// Make sure the JAX side is importable and readable (raises a clear error if not).
#[pyfunction]
pub(crate) fn check_jax(py: Python<'_>) -> PyResult<()> {
    compat(py).map(|_| ())
}

/// The treedef of a tuple whose children have the given treedefs (treeclone's or jaxlib's).
#[pyfunction]
pub(crate) fn treedef_tuple(
    py: Python<'_>,
    treedefs: Vec<Bound<'_, PyAny>>,
) -> PyResult<PyTreeDef> {
    let treedefs = treedefs
        .iter()
        .map(|t| Ok(treedef::as_treedef(t)?.borrow()))
        .collect::<PyResult<Vec<_>>>()?;
    treedef::tuple_of(py, &treedefs)
}
