//! `PyTreeDef`: a tree's structure without its leaves, as a post-order vector of nodes
//! (children before their parent, the root last), equal to JAX's treedef of the same tree.
//!
//! - `build.rs`: unflatten and flatten_up_to, the two walks a treedef guides;
//! - `protocol.rs`: equality and hashing, shared with `SharedTreeDef`;
//! - `serial.rs`: pickling and conversion from and to jaxlib's treedef;
//! - `repr.rs`: JAX's text form.

mod build;
mod floor;
pub mod protocol;
mod repr;
pub mod serial;

pub use floor::unflatten_floor;

use crate::node::{child_indices, Node, NodeKind};
use crate::registry;
use protocol::Structure;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyTuple, PyType};
use std::hash::Hasher;
use std::sync::OnceLock;

/// A pytree's structure: equal to jaxlib's `PyTreeDef` of the same tree.
///
/// >>> import treeclone.tree_util as tu, jax.tree_util as jtu
/// >>> treedef = tu.tree_structure({"a": [1, 2], "b": None})
/// >>> treedef.num_leaves, treedef == jtu.tree_structure({"a": [0, 0], "b": None})
/// (2, True)
/// >>> treedef.unflatten(["x", "y"])
/// {'a': ['x', 'y'], 'b': None}
#[pyclass(frozen, module = "treeclone", name = "PyTreeDef")]
pub struct PyTreeDef {
    pub nodes: Vec<Node>,
    hash: OnceLock<isize>,
}

/// Build nodes from `(kind, arity)` in post-order, computing subtree counts and checking that
/// the sequence is one well-formed tree (so no later walk can index out of bounds).
pub fn nodes_from_parts(py: Python<'_>, parts: Vec<(NodeKind, usize)>) -> PyResult<Vec<Node>> {
    let malformed = |what: &str| PyValueError::new_err(format!("malformed treedef: {what}"));
    let mut nodes: Vec<Node> = Vec::with_capacity(parts.len());
    // (num_leaves, num_nodes) of the subtrees not yet claimed by a parent
    let mut pending: Vec<(usize, usize)> = Vec::new();
    for (kind, arity) in parts {
        if arity > pending.len() {
            return Err(malformed("a node has more children than precede it"));
        }
        match &kind {
            NodeKind::Leaf | NodeKind::None if arity != 0 => {
                return Err(malformed("a leaf or None node has children"))
            }
            NodeKind::Dict(keys) if keys.bind(py).len() != arity => {
                return Err(malformed("a dict node's keys do not match its arity"))
            }
            _ => {}
        }
        let (mut leaves, mut count) = (0usize, 1usize);
        for (l, c) in pending.drain(pending.len() - arity..) {
            leaves += l;
            count += c;
        }
        if matches!(kind, NodeKind::Leaf) {
            leaves = 1;
        }
        pending.push((leaves, count));
        nodes.push(Node {
            kind,
            arity,
            num_leaves: leaves,
            num_nodes: count,
        });
    }
    if pending.len() != 1 {
        return Err(malformed("expected exactly one root"));
    }
    Ok(nodes)
}

/// jaxlib's message for a wrong number of leaves (it names the count only when too few).
pub fn leaf_count_error(expected: usize, got: usize) -> PyErr {
    PyValueError::new_err(if got < expected {
        format!("Too few leaves for PyTreeDef; expected {expected}, got {got}")
    } else {
        format!("Too many leaves for PyTreeDef; expected {expected}.")
    })
}

impl PyTreeDef {
    /// A treedef of well-formed nodes (from a traversal or `nodes_from_parts`).
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
        child_indices(i, self.nodes[i].arity, |j| self.nodes[j].num_nodes)
    }

    /// `(kind, arity)` of every node, for building another treedef from this one's nodes.
    fn parts<'a>(&'a self, py: Python<'a>) -> impl Iterator<Item = (NodeKind, usize)> + 'a {
        self.nodes
            .iter()
            .map(move |n| (n.kind.clone_ref(py), n.arity))
    }
}

impl Structure for PyTreeDef {
    fn hash_cell(&self) -> &OnceLock<isize> {
        &self.hash
    }

    fn hash_nodes(&self, py: Python<'_>, h: &mut impl Hasher) -> PyResult<()> {
        for node in &self.nodes {
            node.hash_into(py, h)?;
        }
        Ok(())
    }

    fn same_nodes(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
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

/// jaxlib's `PyTreeDef` type (`jax.tree_util.PyTreeDef`).
fn jax_treedef_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.import(py, "jax.tree_util", "PyTreeDef")
}

/// `obj` as a treeclone treedef: itself, or a jaxlib `PyTreeDef` converted (every function
/// that takes a treedef accepts either kind).
pub fn as_treedef<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTreeDef>> {
    let py = obj.py();
    if let Ok(def) = obj.cast::<PyTreeDef>() {
        return Ok(def.clone());
    }
    if obj.is_instance(jax_treedef_type(py)?)? {
        return Bound::new(py, serial::from_jax(py, obj)?);
    }
    Err(PyTypeError::new_err(format!(
        "expected a PyTreeDef (treeclone's or jaxlib's), got {}",
        obj.get_type().name()?
    )))
}

/// The treedef of a tuple whose children have the given treedefs.
pub fn tuple_of(py: Python<'_>, treedefs: &[PyRef<'_, PyTreeDef>]) -> PyResult<PyTreeDef> {
    let mut parts: Vec<(NodeKind, usize)> = treedefs.iter().flat_map(|t| t.parts(py)).collect();
    parts.push((NodeKind::Tuple, treedefs.len()));
    Ok(PyTreeDef::new(nodes_from_parts(py, parts)?))
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
    pub fn unflatten<'py>(
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
        let root = self.nodes.len() - 1;
        self.child_indices(root)
            .into_iter()
            .map(|end| {
                let start = end + 1 - self.nodes[end].num_nodes;
                let nodes = self.nodes[start..=end]
                    .iter()
                    .map(|n| n.clone_ref(py))
                    .collect();
                Py::new(py, PyTreeDef::new(nodes))
            })
            .collect()
    }

    /// JAX's `node_data()`: None for a leaf, else `(type, data)`.
    fn node_data<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.root().jax_node_data(py)
    }

    /// Replace every leaf of this treedef by `inner` (treeclone's or jaxlib's treedef).
    fn compose(&self, py: Python<'_>, inner: &Bound<'_, PyAny>) -> PyResult<PyTreeDef> {
        let inner = as_treedef(inner)?;
        let inner = inner.get();
        let mut parts = Vec::with_capacity(self.nodes.len() * inner.nodes.len());
        for node in &self.nodes {
            if matches!(node.kind, NodeKind::Leaf) {
                parts.extend(inner.parts(py));
            } else {
                parts.push((node.kind.clone_ref(py), node.arity));
            }
        }
        Ok(PyTreeDef::new(nodes_from_parts(py, parts)?))
    }

    fn __richcmp__(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        op: CompareOp,
    ) -> PyResult<Py<PyAny>> {
        let converted;
        let other = match other.cast::<PyTreeDef>() {
            Ok(other) => other.get(),
            // A jaxlib treedef compares as the treeclone treedef it converts to; one that does
            // not convert (a node type registered elsewhere than JAX's default registry) is
            // unequal.
            Err(_) if other.is_instance(jax_treedef_type(py)?)? => {
                let Ok(made) = serial::from_jax(py, other) else {
                    return Ok(py.NotImplemented());
                };
                converted = made;
                &converted
            }
            Err(_) => return Ok(py.NotImplemented()),
        };
        protocol::richcmp(py, self, other, op)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        protocol::hash(py, self)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.repr(py)
    }

    /// Pickled as its nodes (see `serial.rs`); custom types by reference.
    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyList>,))> {
        Ok((
            py.import("treeclone._native")?
                .getattr("_treedef_from_state")?,
            (self.state(py)?,),
        ))
    }

    /// The equal jaxlib `PyTreeDef`.
    fn to_jax<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        serial::to_jax(py, self)
    }

    /// Convert a jaxlib `PyTreeDef`.
    #[staticmethod]
    fn from_jax(py: Python<'_>, treedef: &Bound<'_, PyAny>) -> PyResult<PyTreeDef> {
        serial::from_jax(py, treedef)
    }

    // jaxlib's remaining methods, for code written against its treedef. They are not on any
    // hot path, so each is jaxlib's own, run on the equal jaxlib treedef: the same results
    // (and the same quirks) as the installed jaxlib.

    /// jaxlib's `walk(f_node, f_leaf, leaves)`: `f_leaf` on each leaf, `f_node(children
    /// results, node data)` on each node, bottom up.
    fn walk<'py>(
        &self,
        py: Python<'py>,
        f_node: &Bound<'py, PyAny>,
        f_leaf: &Bound<'py, PyAny>,
        leaves: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        serial::to_jax(py, self)?.call_method1("walk", (f_node, f_leaf, leaves))
    }

    /// jaxlib's `from_iterable_tree(tree)`: this structure rebuilt from nested iterables.
    #[pyo3(name = "from_iterable_tree")]
    fn rebuild_from_iterable_tree<'py>(
        &self,
        py: Python<'py>,
        tree: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        serial::to_jax(py, self)?.call_method1("from_iterable_tree", (tree,))
    }

    /// jaxlib's `serialize_using_proto()` (where the installed jaxlib has it).
    fn serialize_using_proto<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        serial::to_jax(py, self)?.call_method0("serialize_using_proto")
    }

    /// jaxlib's `deserialize_using_proto(registry, data)`, as a treeclone treedef.
    #[staticmethod]
    fn deserialize_using_proto(
        py: Python<'_>,
        registry: &Bound<'_, PyAny>,
        data: &Bound<'_, PyBytes>,
    ) -> PyResult<PyTreeDef> {
        let jax =
            jax_treedef_type(py)?.call_method1("deserialize_using_proto", (registry, data))?;
        serial::from_jax(py, &jax)
    }

    /// The treedef whose root has `node_data` (`node_data()`'s form: None for a leaf, else
    /// `(type, data)`) and the given child treedefs (treeclone's or jaxlib's). Treeclone
    /// treedefs use JAX's default registry, the only `registry` accepted.
    #[staticmethod]
    fn from_node_data_and_children(
        py: Python<'_>,
        registry: &Bound<'_, PyAny>,
        node_data: Option<(Bound<'_, PyType>, Bound<'_, PyAny>)>,
        children: &Bound<'_, PyAny>,
    ) -> PyResult<PyTreeDef> {
        let default = py.import("jax.tree_util")?.getattr("default_registry")?;
        if !registry.is(&default) {
            return Err(PyValueError::new_err(
                "treeclone treedefs use JAX's default registry (jax.tree_util.default_registry)",
            ));
        }
        let mut parts = Vec::new();
        let mut arity = 0;
        for child in children.try_iter()? {
            parts.extend(as_treedef(&child?)?.get().parts(py));
            arity += 1;
        }
        match node_data {
            None if arity == 0 => parts.push((NodeKind::Leaf, 0)),
            None => {
                return Err(PyValueError::new_err(
                    "a leaf (node_data None) has no children",
                ))
            }
            Some((ty, data)) => {
                let kind = registry::kind_for_type(py, &ty)?;
                parts.push((serial::node_kind(py, &ty, kind, data)?, arity));
            }
        }
        Ok(PyTreeDef::new(nodes_from_parts(py, parts)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(spec: &[(NodeKind, usize)]) -> Vec<(NodeKind, usize)> {
        Python::attach(|py| spec.iter().map(|(k, a)| (k.clone_ref(py), *a)).collect())
    }

    #[test]
    fn counts_are_computed_in_post_order() {
        Python::attach(|py| {
            // [*, (*, None)]
            let nodes = nodes_from_parts(
                py,
                parts(&[
                    (NodeKind::Leaf, 0),
                    (NodeKind::Leaf, 0),
                    (NodeKind::None, 0),
                    (NodeKind::Tuple, 2),
                    (NodeKind::List, 2),
                ]),
            )
            .unwrap();
            let root = nodes.last().unwrap();
            assert_eq!((root.num_leaves, root.num_nodes), (2, 5));
            assert_eq!((nodes[3].num_leaves, nodes[3].num_nodes), (1, 3));
            assert_eq!((nodes[2].num_leaves, nodes[2].num_nodes), (0, 1));
        });
    }

    #[test]
    fn malformed_sequences_are_rejected() {
        Python::attach(|py| {
            assert!(nodes_from_parts(py, parts(&[(NodeKind::List, 1)])).is_err());
            let two_roots = parts(&[(NodeKind::Leaf, 0), (NodeKind::Leaf, 0)]);
            assert!(nodes_from_parts(py, two_roots).is_err());
            let leaf_with_child = parts(&[(NodeKind::Leaf, 0), (NodeKind::Leaf, 1)]);
            assert!(nodes_from_parts(py, leaf_with_child).is_err());
            let keys = PyTuple::new(py, ["a"]).unwrap().unbind();
            let short_dict = vec![
                (NodeKind::Leaf, 0),
                (NodeKind::Leaf, 0),
                (NodeKind::Dict(keys), 2),
            ];
            assert!(nodes_from_parts(py, short_dict).is_err());
        });
    }
}
