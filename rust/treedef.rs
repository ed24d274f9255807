//! The treedef: a tree's structure without its leaves, as a post-order vector of nodes
//! (children before their parent, the root last).

use crate::registry::{self, compat, Kind};
use pyo3::exceptions::{PyRecursionError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

/// Deepest treedef `to_jax` converts (see there).
const MAX_JAX_DEPTH: usize = 10_000;

pub struct Node {
    pub kind: Kind,
    pub arity: usize,
    /// Leaves in the subtree rooted here.
    pub num_leaves: usize,
    /// Nodes in the subtree rooted here, this one included.
    pub num_nodes: usize,
    /// Dict: tuple of sorted keys; namedtuple: its type; custom: the aux data.
    pub data: Option<Py<PyAny>>,
}

impl Node {
    pub fn leaf() -> Node {
        Node {
            kind: Kind::Leaf,
            arity: 0,
            num_leaves: 1,
            num_nodes: 1,
            data: None,
        }
    }

    fn clone_ref(&self, py: Python<'_>) -> Node {
        Node {
            kind: self.kind.clone(),
            arity: self.arity,
            num_leaves: self.num_leaves,
            num_nodes: self.num_nodes,
            data: self.data.as_ref().map(|d| d.clone_ref(py)),
        }
    }

    /// Feed what equality compares, except aux data (which need not hash), into `h`.
    pub fn hash_into(&self, py: Python<'_>, h: &mut impl Hasher) -> PyResult<()> {
        self.kind.code().hash(h);
        self.arity.hash(h);
        match &self.kind {
            Kind::Custom(c) => (c.ty.as_ptr() as usize).hash(h),
            Kind::NamedTuple => (self.data.as_ref().map_or(0, |d| d.as_ptr() as usize)).hash(h),
            Kind::Dict => {
                for key in self.data.as_ref().expect("dict keys").bind(py).try_iter()? {
                    key?.hash()?.hash(h);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// JAX's node equality: kind and arity, then node data (identity first, then `==`; an
    /// `==` that raises becomes JAX's ValueError about metadata fields).
    pub fn same_as(&self, py: Python<'_>, other: &Node) -> PyResult<bool> {
        if !self.kind.same(&other.kind) || self.arity != other.arity {
            return Ok(false);
        }
        match (&self.data, &other.data) {
            (None, None) => Ok(true),
            (Some(x), Some(y)) if x.is(y) => Ok(true),
            (Some(x), Some(y)) => match x.bind(py).eq(y.bind(py)) {
                Ok(equal) => Ok(equal),
                Err(err) => {
                    let new = PyValueError::new_err(
                        "Exception raised while checking equality of metadata fields \
                         of pytree. Make sure that metadata fields are hashable and \
                         have simple equality semantics. (Note: arrays cannot be \
                         passed as metadata fields!)",
                    );
                    new.set_cause(py, Some(err));
                    Err(new)
                }
            },
            _ => Ok(false),
        }
    }

    /// The Python type this node rebuilds (None for a leaf).
    pub fn node_type<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        Some(match &self.kind {
            Kind::Leaf => return None,
            Kind::None => py.None().bind(py).get_type().into_any(),
            Kind::Tuple => py.get_type::<PyTuple>().into_any(),
            Kind::List => py.get_type::<PyList>().into_any(),
            Kind::Dict => py.get_type::<PyDict>().into_any(),
            Kind::NamedTuple => self.data.as_ref()?.bind(py).clone(),
            Kind::Custom(c) => c.ty.bind(py).clone().into_any(),
        })
    }
}

/// Build nodes from (kind, arity, data) in post-order, computing subtree counts and checking
/// that the sequence is one well-formed tree.
pub fn nodes_from_parts(parts: Vec<(Kind, usize, Option<Py<PyAny>>)>) -> PyResult<Vec<Node>> {
    let mut nodes: Vec<Node> = Vec::with_capacity(parts.len());
    // (num_leaves, num_nodes) of the subtrees not yet claimed by a parent
    let mut pending: Vec<(usize, usize)> = Vec::new();
    for (kind, arity, data) in parts {
        if arity > pending.len() {
            return Err(PyValueError::new_err(
                "malformed treedef: a node has more children than precede it",
            ));
        }
        let (mut leaves, mut count) = (0usize, 1usize);
        for (l, c) in pending.drain(pending.len() - arity..) {
            leaves += l;
            count += c;
        }
        if matches!(kind, Kind::Leaf) {
            leaves = 1;
        }
        pending.push((leaves, count));
        nodes.push(Node {
            kind,
            arity,
            num_leaves: leaves,
            num_nodes: count,
            data,
        });
    }
    if pending.len() != 1 {
        return Err(PyValueError::new_err(
            "malformed treedef: expected exactly one root",
        ));
    }
    Ok(nodes)
}

#[pyclass(frozen, module = "treeclone", name = "PyTreeDef")]
pub struct PyTreeDef {
    pub nodes: Vec<Node>,
    hash: OnceLock<isize>,
}

impl PyTreeDef {
    pub fn new(nodes: Vec<Node>) -> PyTreeDef {
        debug_assert!(!nodes.is_empty());
        PyTreeDef {
            nodes,
            hash: OnceLock::new(),
        }
    }

    fn root(&self) -> &Node {
        self.nodes.last().expect("a treedef has a root")
    }

    /// Indices (in `nodes`) of node `i`'s children, in order.
    fn child_indices(&self, i: usize) -> Vec<usize> {
        let mut children = Vec::with_capacity(self.nodes[i].arity);
        let mut end = i;
        for _ in 0..self.nodes[i].arity {
            children.push(end - 1);
            end -= self.nodes[end - 1].num_nodes;
        }
        children.reverse();
        children
    }

    /// Index ranges of the root's children in `nodes`, in order.
    fn child_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let root = self.nodes.len() - 1;
        let mut ranges = Vec::with_capacity(self.root().arity);
        let mut end = root;
        for _ in 0..self.root().arity {
            let start = end - self.nodes[end - 1].num_nodes;
            ranges.push(start..end);
            end = start;
        }
        ranges.reverse();
        ranges
    }

    /// Rebuild a tree from owned leaves.
    pub fn unflatten_vec<'py>(
        &self,
        py: Python<'py>,
        leaves: Vec<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let expected = self.root().num_leaves;
        if leaves.len() != expected {
            return Err(leaf_count_error(expected, leaves.len()));
        }
        let mut leaves = leaves.into_iter();
        self.build(py, |_| Ok(leaves.next().expect("counted").into_bound(py)))
    }

    /// Rebuild a tree, taking the i-th leaf from `leaf(i)`.
    fn build<'py>(
        &self,
        py: Python<'py>,
        mut leaf: impl FnMut(usize) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut stack: Vec<Bound<'py, PyAny>> = Vec::with_capacity(16);
        let mut next_leaf = 0;
        for node in &self.nodes {
            let obj = match &node.kind {
                Kind::Leaf => {
                    next_leaf += 1;
                    leaf(next_leaf - 1)?
                }
                _ => {
                    let start = stack.len() - node.arity;
                    let children = stack.drain(start..);
                    build_node(py, node, children)?
                }
            };
            stack.push(obj);
        }
        Ok(stack.pop().expect("one root"))
    }

    /// Leaves of `tree` up to this structure: each leaf here matches a whole subtree there.
    pub fn flatten_up_to_vec<'py>(
        &self,
        tree: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let py = tree.py();
        let mut leaves: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.root().num_leaves);
        // Walk the post-order nodes backwards: a pre-order walk visiting children right to left.
        let mut agenda: Vec<Bound<'py, PyAny>> = vec![tree.clone()];
        for node in self.nodes.iter().rev() {
            let obj = agenda.pop().expect("agenda matches the treedef");
            match &node.kind {
                Kind::Leaf => {
                    leaves.push(obj);
                    continue;
                }
                Kind::None => {
                    if !obj.is_none() {
                        return Err(PyValueError::new_err(format!(
                            "Expected None, got {}.",
                            obj.repr()?
                        )));
                    }
                }
                Kind::Tuple => {
                    let t = obj
                        .cast_exact::<PyTuple>()
                        .map_err(|_| expected_error("tuple", &obj))?;
                    check_arity("Tuple", node.arity, t.len(), &obj)?;
                    agenda.extend(t.iter());
                }
                Kind::List => {
                    let l = obj
                        .cast_exact::<PyList>()
                        .map_err(|_| expected_error("list", &obj))?;
                    check_arity("List", node.arity, l.len(), &obj)?;
                    agenda.extend(l.iter());
                }
                Kind::Dict => {
                    let d = obj
                        .cast_exact::<PyDict>()
                        .map_err(|_| expected_error("dict", &obj))?;
                    let keys = node.data.as_ref().expect("dict keys").bind(py);
                    let keys = keys.cast::<PyTuple>()?;
                    let mismatch = || -> PyResult<PyErr> {
                        let present = d.keys();
                        present.sort().ok();
                        Ok(PyValueError::new_err(format!(
                            "Dict key mismatch; expected keys: {}; present keys: {}.",
                            keys.to_list().repr()?,
                            present.repr()?
                        )))
                    };
                    if d.len() != node.arity {
                        return Err(mismatch()?);
                    }
                    let start = agenda.len();
                    for key in keys.iter() {
                        match d.get_item(&key)? {
                            Some(v) => agenda.push(v),
                            None => return Err(mismatch()?),
                        }
                    }
                    debug_assert_eq!(agenda.len() - start, node.arity);
                }
                Kind::NamedTuple => {
                    let ty = node.data.as_ref().expect("namedtuple type").bind(py);
                    if !obj.get_type().is(ty) {
                        return Err(PyValueError::new_err(format!(
                            "Expected named tuple of type {}, got {}.",
                            ty.repr()?,
                            obj.repr()?
                        )));
                    }
                    let t = obj.cast::<PyTuple>()?;
                    check_arity("Named tuple", node.arity, t.len(), &obj)?;
                    agenda.extend(t.iter());
                }
                Kind::Custom(custom) => {
                    let ty = custom.ty.bind(py);
                    if !obj.get_type().is(ty) {
                        return Err(PyValueError::new_err(format!(
                            "Custom node type mismatch; expected type: {}; value: {}.",
                            ty.repr()?,
                            obj.repr()?
                        )));
                    }
                    let (children, aux) = crate::flatten::call_custom_flatten(&obj, custom)?;
                    let expected_aux = node.data.as_ref().expect("aux").bind(py);
                    // Identity first, as JAX: the same aux object always matches itself (even
                    // an array, or NaN).
                    if !aux.is(expected_aux) && !aux.eq(expected_aux)? {
                        return Err(PyValueError::new_err(format!(
                            "Mismatch custom node data: {} != {}; value: {}.",
                            expected_aux.repr()?,
                            aux.repr()?,
                            obj.repr()?
                        )));
                    }
                    check_arity("Custom node", node.arity, children.len(), &obj)?;
                    agenda.extend(children);
                }
            }
        }
        leaves.reverse();
        Ok(leaves)
    }

    /// Levels from the root to the deepest leaf.
    fn depth(&self) -> usize {
        let mut depths: Vec<usize> = Vec::new();
        for node in &self.nodes {
            let below = depths.drain(depths.len() - node.arity..).max().unwrap_or(0);
            depths.push(below + 1);
        }
        depths.pop().unwrap_or(0)
    }

    fn compute_hash(&self, py: Python<'_>) -> PyResult<isize> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for node in &self.nodes {
            node.hash_into(py, &mut h)?;
        }
        Ok(h.finish() as isize)
    }

    /// Node by node in post-order, as JAX compares: an aux comparison that raises is reached
    /// (or not) exactly when JAX reaches it.
    fn structural_eq(&self, py: Python<'_>, other: &PyTreeDef) -> PyResult<bool> {
        if self.nodes.len() != other.nodes.len() {
            return Ok(false);
        }
        for (a, b) in self.nodes.iter().zip(&other.nodes) {
            if !a.same_as(py, b)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// What `__richcmp__` returns for `op` given whether two treedefs are equal.
pub(crate) fn equality_result(py: Python<'_>, eq: bool, op: CompareOp) -> PyResult<Py<PyAny>> {
    Ok(match op {
        CompareOp::Eq => eq.into_pyobject(py)?.to_owned().into_any().unbind(),
        CompareOp::Ne => (!eq).into_pyobject(py)?.to_owned().into_any().unbind(),
        _ => py.NotImplemented(),
    })
}

fn expected_error(what: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    match obj.repr() {
        Ok(r) => PyValueError::new_err(format!("Expected {what}, got {r}.")),
        Err(e) => e,
    }
}

fn check_arity(what: &str, expected: usize, got: usize, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    if expected != got {
        return Err(PyValueError::new_err(format!(
            "{what} arity mismatch: {got} != {expected}; {}: {}.",
            what.to_lowercase(),
            obj.repr()?
        )));
    }
    Ok(())
}

pub fn leaf_count_error(expected: usize, got: usize) -> PyErr {
    let which = if got < expected { "few" } else { "many" };
    PyValueError::new_err(format!(
        "Too {which} leaves for PyTreeDef; expected {expected}, got {got}."
    ))
}

#[cfg(not(Py_3_13))]
extern "C" {
    // Exported by CPython 3.8-3.12 (Include/cpython/dictobject.h): a dict with room for
    // `minused` items, so filling a wide dict does not resize it over and over.
    fn _PyDict_NewPresized(minused: ffi::Py_ssize_t) -> *mut ffi::PyObject;
}

/// An empty dict with room for `size` items.
fn new_dict(py: Python<'_>, size: usize) -> PyResult<Bound<'_, PyDict>> {
    #[cfg(not(Py_3_13))]
    if size > 5 {
        // SAFETY: returns a new reference to an exact dict, or NULL with an exception set.
        return unsafe {
            Bound::from_owned_ptr_or_err(py, _PyDict_NewPresized(size as ffi::Py_ssize_t))
                .map(|d| d.cast_into_unchecked())
        };
    }
    let _ = size;
    Ok(PyDict::new(py))
}

/// Build one node's Python object from its already built children.
pub(crate) fn build_node<'py>(
    py: Python<'py>,
    node: &Node,
    children: std::vec::Drain<'_, Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match &node.kind {
        Kind::Leaf => unreachable!("leaves are not built"),
        Kind::None => py.None().into_bound(py),
        Kind::Tuple => PyTuple::new(py, children)?.into_any(),
        Kind::List => PyList::new(py, children)?.into_any(),
        Kind::Dict => {
            let keys = node.data.as_ref().expect("dict keys").bind(py);
            let keys = keys.cast::<PyTuple>()?;
            let dict = new_dict(py, node.arity)?;
            for (key, value) in keys.iter_borrowed().zip(children) {
                // SAFETY: dict, key and value are valid objects; PyDict_SetItem increfs both.
                let rc =
                    unsafe { ffi::PyDict_SetItem(dict.as_ptr(), key.as_ptr(), value.as_ptr()) };
                if rc != 0 {
                    return Err(PyErr::fetch(py));
                }
            }
            dict.into_any()
        }
        Kind::NamedTuple => {
            let ty = node.data.as_ref().expect("namedtuple type").bind(py);
            ty.call1(PyTuple::new(py, children)?)?
        }
        Kind::Custom(custom) => {
            let aux = node.data.as_ref().expect("aux").bind(py);
            custom
                .unflatten
                .bind(py)
                .call1((aux, PyTuple::new(py, children)?))?
        }
    })
}

fn type_name(ty: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(ty.getattr("__name__")?.str()?.to_string())
}

#[pymethods]
impl PyTreeDef {
    #[getter]
    fn num_leaves(&self) -> usize {
        self.root().num_leaves
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Rebuild the tree from an iterable of leaves.
    fn unflatten<'py>(
        &self,
        py: Python<'py>,
        leaves: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let expected = self.root().num_leaves;
        if let Ok(list) = leaves.cast_exact::<PyList>() {
            // Read the list as we go: a custom unflatten function may change it meanwhile, so
            // every read is bounds-checked and takes its own reference.
            if list.len() != expected {
                return Err(leaf_count_error(expected, list.len()));
            }
            let tree = self.build(py, |i| {
                list.get_item(i).map_err(|_| {
                    PyValueError::new_err("the leaves list changed size during unflatten")
                })
            })?;
            if list.len() != expected {
                // An unflatten function appended to the list meanwhile: as JAX, too many.
                return Err(leaf_count_error(expected, list.len()));
            }
            return Ok(tree);
        }
        if let Ok(tuple) = leaves.cast_exact::<PyTuple>() {
            if tuple.len() != expected {
                return Err(leaf_count_error(expected, tuple.len()));
            }
            return self.build(py, |i| tuple.get_item(i));
        }
        let iter = leaves.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "unflatten() expects an iterable of leaves, got {}",
                leaves
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let leaves = iter
            .map(|x| x.map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()?;
        self.unflatten_vec(py, leaves)
    }

    fn flatten_up_to<'py>(&self, tree: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(tree.py(), self.flatten_up_to_vec(tree)?)
    }

    fn children(&self, py: Python<'_>) -> PyResult<Vec<Py<PyTreeDef>>> {
        self.child_ranges()
            .into_iter()
            .map(|r| {
                let nodes = self.nodes[r].iter().map(|n| n.clone_ref(py)).collect();
                Py::new(py, PyTreeDef::new(nodes))
            })
            .collect()
    }

    /// JAX's `node_data()`: None for a leaf, else `(type, data)`.
    fn node_data<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let root = self.root();
        let Some(ty) = root.node_type(py) else {
            return Ok(None);
        };
        let data = match &root.kind {
            Kind::Dict => root
                .data
                .as_ref()
                .expect("keys")
                .bind(py)
                .cast::<PyTuple>()?
                .to_list()
                .into_any(),
            Kind::Custom(_) => root.data.as_ref().expect("aux").bind(py).clone(),
            _ => py.None().into_bound(py),
        };
        Ok(Some(PyTuple::new(py, [ty, data])?))
    }

    /// Replace every leaf of this treedef by `inner`.
    fn compose(&self, py: Python<'_>, inner: &PyTreeDef) -> PyResult<PyTreeDef> {
        let mut parts = Vec::with_capacity(self.nodes.len() * inner.nodes.len());
        for node in &self.nodes {
            if matches!(node.kind, Kind::Leaf) {
                for n in &inner.nodes {
                    parts.push((
                        n.kind.clone(),
                        n.arity,
                        n.data.as_ref().map(|d| d.clone_ref(py)),
                    ));
                }
            } else {
                parts.push((
                    node.kind.clone(),
                    node.arity,
                    node.data.as_ref().map(|d| d.clone_ref(py)),
                ));
            }
        }
        Ok(PyTreeDef::new(nodes_from_parts(parts)?))
    }

    fn __richcmp__(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        op: CompareOp,
    ) -> PyResult<Py<PyAny>> {
        let Ok(o) = other.cast::<PyTreeDef>() else {
            return Ok(py.NotImplemented());
        };
        equality_result(py, self.structural_eq(py, o.get())?, op)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        if let Some(h) = self.hash.get() {
            return Ok(*h);
        }
        let h = self.compute_hash(py)?;
        Ok(*self.hash.get_or_init(|| h))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        // Pre-order over an explicit stack, writing into one string: linear at any depth.
        enum Item {
            Node(usize),
            Text(String),
        }
        let mut out = String::from("PyTreeDef(");
        let mut work = vec![Item::Node(self.nodes.len() - 1)];
        while let Some(item) = work.pop() {
            let i = match item {
                Item::Text(t) => {
                    out.push_str(&t);
                    continue;
                }
                Item::Node(i) => i,
            };
            let node = &self.nodes[i];
            let (open, close) = match &node.kind {
                Kind::Leaf => ("*".to_string(), String::new()),
                Kind::None => ("None".to_string(), String::new()),
                Kind::Tuple if node.arity == 1 => ("(".to_string(), ",)".to_string()),
                Kind::Tuple => ("(".to_string(), ")".to_string()),
                Kind::List => ("[".to_string(), "]".to_string()),
                Kind::Dict => ("{".to_string(), "}".to_string()),
                Kind::NamedTuple => {
                    let ty = node.data.as_ref().expect("type").bind(py);
                    (
                        format!("CustomNode(namedtuple[{}], [", type_name(ty)?),
                        "])".to_string(),
                    )
                }
                Kind::Custom(c) => {
                    let aux = node.data.as_ref().expect("aux").bind(py);
                    let name = type_name(c.ty.bind(py).as_any())?;
                    (
                        format!("CustomNode({}[{}], [", name, aux.str()?),
                        "])".to_string(),
                    )
                }
            };
            out.push_str(&open);
            work.push(Item::Text(close));
            let children = self.child_indices(i);
            let keys = match &node.kind {
                Kind::Dict => Some(
                    node.data
                        .as_ref()
                        .expect("keys")
                        .bind(py)
                        .cast::<PyTuple>()?
                        .clone(),
                ),
                _ => None,
            };
            // Pushed in reverse so they pop in order.
            for (k, &child) in children.iter().enumerate().rev() {
                work.push(Item::Node(child));
                if let Some(keys) = &keys {
                    work.push(Item::Text(format!("{}: ", keys.get_item(k)?.repr()?)));
                }
                if k > 0 {
                    work.push(Item::Text(", ".to_string()));
                }
            }
        }
        out.push(')');
        Ok(out)
    }

    /// Pickled as its nodes: (kind code, arity, data, type) each; custom types by reference.
    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyList>,))> {
        let state = PyList::empty(py);
        for node in &self.nodes {
            let data = match &node.data {
                Some(d) => d.bind(py).clone(),
                None => py.None().into_bound(py),
            };
            let ty = node
                .node_type(py)
                .unwrap_or_else(|| py.None().into_bound(py));
            state.append((node.kind.code(), node.arity, data, ty))?;
        }
        let ctor = py
            .import("treeclone._native")?
            .getattr("_treedef_from_state")?;
        Ok((ctor, (state,)))
    }

    /// The equal jaxlib `PyTreeDef`.
    fn to_jax<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // JAX builds a node by copying its children, so the cost grows with depth squared;
        // JAX's own flatten stops far shallower than this anyway.
        let depth = self.depth();
        if depth > MAX_JAX_DEPTH {
            return Err(PyRecursionError::new_err(format!(
                "to_jax: this treedef is nested {depth} levels deep; more than {MAX_JAX_DEPTH} \
                 cannot be converted to a JAX treedef"
            )));
        }
        let make = compat(py)?.to_jax_node.bind(py);
        let mut stack: Vec<Bound<'py, PyAny>> = Vec::new();
        for node in &self.nodes {
            let children = PyList::new(py, stack.drain(stack.len() - node.arity..))?;
            let node_data = self_node_data(py, node)?;
            stack.push(make.call1((node_data, children))?);
        }
        Ok(stack.pop().expect("one root"))
    }

    /// Convert a jaxlib `PyTreeDef`.
    #[staticmethod]
    fn from_jax(py: Python<'_>, treedef: &Bound<'_, PyAny>) -> PyResult<PyTreeDef> {
        // Explicit stack: (jax treedef, children already pushed?)
        let mut parts = Vec::new();
        let mut work: Vec<(Bound<'_, PyAny>, bool)> = vec![(treedef.clone(), false)];
        while let Some((td, expanded)) = work.pop() {
            let node_data = td.call_method0("node_data")?;
            if node_data.is_none() {
                parts.push((Kind::Leaf, 0, None));
                continue;
            }
            let children = td.call_method0("children")?.cast_into::<PyList>()?;
            if !expanded {
                work.push((td, true));
                for child in children.iter().rev() {
                    work.push((child, false));
                }
                continue;
            }
            let (ty, data): (Bound<'_, PyType>, Bound<'_, PyAny>) = node_data.extract()?;
            let kind = registry::kind_for_type(py, &ty)?;
            let data = node_data_to_internal(py, &kind, &ty, data)?;
            parts.push((kind, children.len(), data));
        }
        // `work` is LIFO with children pushed reversed, so parts came out in post-order.
        Ok(PyTreeDef::new(nodes_from_parts(parts)?))
    }
}

/// JAX-style node data `(type, data)` for one node (None for a leaf).
fn self_node_data<'py>(py: Python<'py>, node: &Node) -> PyResult<Bound<'py, PyAny>> {
    let Some(ty) = node.node_type(py) else {
        return Ok(py.None().into_bound(py));
    };
    let data = match &node.kind {
        Kind::Dict => node
            .data
            .as_ref()
            .expect("keys")
            .bind(py)
            .cast::<PyTuple>()?
            .to_list()
            .into_any(),
        Kind::Custom(_) => node.data.as_ref().expect("aux").bind(py).clone(),
        _ => py.None().into_bound(py),
    };
    Ok(PyTuple::new(py, [ty, data])?.into_any())
}

/// The data stored in a node, from JAX-style node data of a node of type `ty`.
fn node_data_to_internal(
    py: Python<'_>,
    kind: &Kind,
    ty: &Bound<'_, PyType>,
    data: Bound<'_, PyAny>,
) -> PyResult<Option<Py<PyAny>>> {
    Ok(match kind {
        Kind::Leaf => {
            return Err(PyTypeError::new_err(format!(
                "{} is not a pytree node type known to treeclone",
                ty.repr()?
            )))
        }
        Kind::Dict => Some(
            PyTuple::new(py, data.try_iter()?.collect::<PyResult<Vec<_>>>()?)?
                .into_any()
                .unbind(),
        ),
        Kind::NamedTuple => Some(ty.clone().into_any().unbind()),
        Kind::Custom(_) => Some(data.unbind()),
        _ => None,
    })
}

/// Inverse of `__reduce__`.
#[pyfunction]
pub fn _treedef_from_state(py: Python<'_>, state: &Bound<'_, PyList>) -> PyResult<PyTreeDef> {
    let mut parts = Vec::with_capacity(state.len());
    for item in state.iter() {
        let (code, arity, data, ty): (u8, usize, Bound<'_, PyAny>, Bound<'_, PyAny>) =
            item.extract()?;
        if code == 0 {
            parts.push((Kind::Leaf, 0, None));
            continue;
        }
        let ty = ty.cast_into::<PyType>()?;
        let kind = registry::kind_for_type(py, &ty)?;
        if kind.code() != code {
            return Err(PyValueError::new_err(format!(
                "cannot unpickle treedef: {} is no longer registered as the same kind of node",
                ty.repr()?
            )));
        }
        let data = match kind {
            Kind::Dict => Some(data.unbind()),
            Kind::NamedTuple => Some(ty.clone().into_any().unbind()),
            Kind::Custom(_) => Some(data.unbind()),
            _ => None,
        };
        parts.push((kind, arity, data));
    }
    Ok(PyTreeDef::new(nodes_from_parts(parts)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(spec: &[(Kind, usize)]) -> Vec<(Kind, usize, Option<Py<PyAny>>)> {
        spec.iter().map(|(k, a)| (k.clone(), *a, None)).collect()
    }

    #[test]
    fn counts_are_computed_in_post_order() {
        // [*, (*, None)]
        let nodes = nodes_from_parts(parts(&[
            (Kind::Leaf, 0),
            (Kind::Leaf, 0),
            (Kind::None, 0),
            (Kind::Tuple, 2),
            (Kind::List, 2),
        ]))
        .unwrap();
        let root = nodes.last().unwrap();
        assert_eq!((root.num_leaves, root.num_nodes), (2, 5));
        assert_eq!((nodes[3].num_leaves, nodes[3].num_nodes), (1, 3));
        assert_eq!((nodes[2].num_leaves, nodes[2].num_nodes), (0, 1));
    }

    #[test]
    fn malformed_sequences_are_rejected() {
        Python::attach(|_| {
            assert!(nodes_from_parts(parts(&[(Kind::List, 1)])).is_err());
            assert!(nodes_from_parts(parts(&[(Kind::Leaf, 0), (Kind::Leaf, 0)])).is_err());
        });
    }
}
