//! A pytree node: what kind of container it is, with the data that kind needs (typed, so no
//! code has to guess what a payload means), and how many children it has. Both treedef types
//! store `Node`s in post-order.

mod build;
mod expand;
pub mod known;
pub mod memo;

pub use build::{build_node, new_sequence};
pub use expand::{call_custom_flatten, expand, key_entry_of};

use crate::registry::{CustomType, Kind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A node's kind with its payload.
pub enum NodeKind {
    Leaf,
    None,
    Tuple,
    List,
    /// The keys, in child order (sorted, as JAX orders them).
    Dict(Py<PyTuple>),
    /// The namedtuple's type.
    NamedTuple(Py<PyType>),
    /// The registered type and the node's aux data.
    Custom(Arc<CustomType>, Py<PyAny>),
}

impl NodeKind {
    /// The classification of this node's type.
    pub fn kind(&self) -> Kind {
        match self {
            NodeKind::Leaf => Kind::Leaf,
            NodeKind::None => Kind::None,
            NodeKind::Tuple => Kind::Tuple,
            NodeKind::List => Kind::List,
            NodeKind::Dict(_) => Kind::Dict,
            NodeKind::NamedTuple(_) => Kind::NamedTuple,
            NodeKind::Custom(c, _) => Kind::Custom(c.clone()),
        }
    }

    pub fn clone_ref(&self, py: Python<'_>) -> NodeKind {
        match self {
            NodeKind::Leaf => NodeKind::Leaf,
            NodeKind::None => NodeKind::None,
            NodeKind::Tuple => NodeKind::Tuple,
            NodeKind::List => NodeKind::List,
            NodeKind::Dict(k) => NodeKind::Dict(k.clone_ref(py)),
            NodeKind::NamedTuple(t) => NodeKind::NamedTuple(t.clone_ref(py)),
            NodeKind::Custom(c, aux) => NodeKind::Custom(c.clone(), aux.clone_ref(py)),
        }
    }

    /// A small number per kind, for hashing.
    fn tag(&self) -> u8 {
        match self {
            NodeKind::Leaf => 0,
            NodeKind::None => 1,
            NodeKind::Tuple => 2,
            NodeKind::List => 3,
            NodeKind::Dict(_) => 4,
            NodeKind::NamedTuple(_) => 5,
            NodeKind::Custom(..) => 6,
        }
    }

    /// The Python type this node rebuilds (None for a leaf).
    pub fn node_type<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyType>> {
        Some(match self {
            NodeKind::Leaf => return None,
            NodeKind::None => py.None().bind(py).get_type(),
            NodeKind::Tuple => py.get_type::<PyTuple>(),
            NodeKind::List => py.get_type::<PyList>(),
            NodeKind::Dict(_) => py.get_type::<PyDict>(),
            NodeKind::NamedTuple(t) => t.bind(py).clone(),
            NodeKind::Custom(c, _) => c.ty.bind(py).clone(),
        })
    }

    /// The payload as a Python object: a dict's keys tuple, a namedtuple's type, a custom
    /// node's aux data; None for the other kinds.
    pub fn raw_data<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        match self {
            NodeKind::Dict(keys) => Some(keys.bind(py).clone().into_any()),
            NodeKind::NamedTuple(ty) => Some(ty.bind(py).clone().into_any()),
            NodeKind::Custom(_, aux) => Some(aux.bind(py).clone()),
            _ => None,
        }
    }

    /// The data JAX's `node_data()` shows: a dict's keys as a list, a custom node's aux data,
    /// None otherwise.
    pub fn jax_data<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        match self {
            NodeKind::Dict(keys) => keys.bind(py).to_list().into_any(),
            NodeKind::Custom(_, aux) => aux.bind(py).clone(),
            _ => py.None().into_bound(py),
        }
    }
}

/// One node of a treedef, in post-order.
pub struct Node {
    pub kind: NodeKind,
    pub arity: usize,
    /// Leaf entries in the subtree rooted here.
    pub num_leaves: usize,
    /// Entries in the subtree rooted here, this one included: the children of the node at
    /// index `i` end at `i - 1`, and each child's subtree starts `num_nodes` before its end.
    pub num_nodes: usize,
}

impl Node {
    pub fn leaf() -> Node {
        Node {
            kind: NodeKind::Leaf,
            arity: 0,
            num_leaves: 1,
            num_nodes: 1,
        }
    }

    /// A container without children.
    pub fn childless(kind: NodeKind) -> Node {
        Node {
            kind,
            arity: 0,
            num_leaves: 0,
            num_nodes: 1,
        }
    }

    pub fn clone_ref(&self, py: Python<'_>) -> Node {
        Node {
            kind: self.kind.clone_ref(py),
            arity: self.arity,
            num_leaves: self.num_leaves,
            num_nodes: self.num_nodes,
        }
    }

    /// Feed what equality compares, except aux data (which need not hash), into `h`.
    pub fn hash_into(&self, py: Python<'_>, h: &mut impl Hasher) -> PyResult<()> {
        self.kind.tag().hash(h);
        self.arity.hash(h);
        match &self.kind {
            NodeKind::Custom(c, _) => (c.ty.as_ptr() as usize).hash(h),
            NodeKind::NamedTuple(t) => (t.as_ptr() as usize).hash(h),
            NodeKind::Dict(keys) => {
                for key in keys.bind(py).iter() {
                    key.hash()?.hash(h);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// JAX's node equality: kind and arity, then node data (identity first, then `==`; an
    /// `==` that raises becomes JAX's ValueError about metadata fields).
    pub fn same_as(&self, py: Python<'_>, other: &Node) -> PyResult<bool> {
        if self.arity != other.arity {
            return Ok(false);
        }
        let (x, y): (&Py<PyAny>, &Py<PyAny>) = match (&self.kind, &other.kind) {
            (NodeKind::Leaf, NodeKind::Leaf)
            | (NodeKind::None, NodeKind::None)
            | (NodeKind::Tuple, NodeKind::Tuple)
            | (NodeKind::List, NodeKind::List) => return Ok(true),
            (NodeKind::NamedTuple(a), NodeKind::NamedTuple(b)) => (a.as_any(), b.as_any()),
            (NodeKind::Dict(a), NodeKind::Dict(b)) => (a.as_any(), b.as_any()),
            (NodeKind::Custom(a, x), NodeKind::Custom(b, y)) if a.ty.is(&b.ty) => (x, y),
            _ => return Ok(false),
        };
        if x.is(y) {
            return Ok(true);
        }
        x.bind(py).eq(y.bind(py)).map_err(|err| {
            let new = PyValueError::new_err(
                "Exception raised while checking equality of metadata fields of pytree. Make \
                 sure that metadata fields are hashable and have simple equality semantics. \
                 (Note: arrays cannot be passed as metadata fields!)",
            );
            new.set_cause(py, Some(err));
            new
        })
    }

    /// JAX's `node_data()` of this node: None for a leaf, else `(type, data)`.
    pub fn jax_node_data<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(ty) = self.kind.node_type(py) else {
            return Ok(None);
        };
        Ok(Some(PyTuple::new(
            py,
            [ty.into_any(), self.kind.jax_data(py)],
        )?))
    }
}

/// Indices of the children of the node at `end` (with `arity` children), in order, in a
/// post-order sequence whose subtree sizes `size(i)` gives: O(arity).
pub fn child_indices(end: usize, arity: usize, size: impl Fn(usize) -> usize) -> Vec<usize> {
    let mut children = Vec::with_capacity(arity);
    let mut next = end;
    for _ in 0..arity {
        children.push(next - 1);
        next -= size(next - 1);
    }
    children.reverse();
    children
}

#[cfg(test)]
mod tests {
    use super::child_indices;

    #[test]
    fn children_skip_whole_subtrees() {
        // [a, [b, c], d]: post-order a, b, c, [b, c], d, root
        let sizes = [1, 1, 1, 3, 1, 6];
        assert_eq!(child_indices(5, 3, |i| sizes[i]), vec![0, 3, 4]);
        assert_eq!(child_indices(3, 2, |i| sizes[i]), vec![1, 2]);
        assert!(child_indices(0, 0, |i| sizes[i]).is_empty());
    }
}
