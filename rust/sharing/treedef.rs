//! `SharedTreeDef`: a tree's structure with its sharing (which leaves and containers are one
//! object), in post-order. Each node stores its subtree's size, so a node's children are found
//! in O(arity).

use crate::node::{build_node, child_indices, Node, NodeKind};
use crate::treedef::leaf_count_error;
use crate::treedef::protocol::{self, Structure};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyList, PyType};
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

/// One entry of a shared treedef, in post-order.
pub enum Entry {
    /// A leaf: index into the distinct leaves (its slot).
    Leaf(usize),
    /// A container met earlier in the traversal: index of its first entry.
    Ref(usize),
    /// A container met for the first time (`num_nodes`: entries in its subtree; `num_leaves`:
    /// leaf entries in it, shared ones counted at each place).
    Node(Node),
}

impl Entry {
    fn arity(&self) -> usize {
        match self {
            Entry::Node(n) => n.arity,
            _ => 0,
        }
    }

    /// Entries in the subtree rooted here.
    pub fn size(&self) -> usize {
        match self {
            Entry::Node(n) => n.num_nodes,
            _ => 1,
        }
    }
}

/// What Python sees of one entry (`SharedTreeDef.node_info()`), at trace time.
#[pyclass(frozen, module = "treeclone._native")]
pub enum EntryInfo {
    /// A leaf, in this slot of the distinct leaves.
    Leaf { slot: usize },
    /// A container met before, at entry `target`.
    Ref { target: usize },
    /// A container: its type, arity, payload (dict keys in order, namedtuple type, custom aux
    /// data; None otherwise), subtree size in entries, and its children's entry indices.
    Node {
        node_type: Py<PyType>,
        arity: usize,
        data: Option<Py<PyAny>>,
        size: usize,
        children: Vec<usize>,
    },
}

/// The structure of a tree with its sharing: which leaves and containers are the same object.
#[pyclass(frozen, module = "treeclone", name = "SharedTreeDef")]
pub struct SharedTreeDef {
    pub entries: Vec<Entry>,
    pub num_slots: usize,
    /// Whether some container is shared (a `Ref` entry exists).
    pub has_refs: bool,
    hash: OnceLock<isize>,
}

impl SharedTreeDef {
    pub fn new(entries: Vec<Entry>, num_slots: usize) -> Self {
        let has_refs = entries.iter().any(|e| matches!(e, Entry::Ref(_)));
        SharedTreeDef {
            entries,
            num_slots,
            has_refs,
            hash: OnceLock::new(),
        }
    }

    /// Indices of entry `i`'s children, in order.
    pub fn child_indices(&self, i: usize) -> PyResult<Vec<usize>> {
        let Some(entry) = self.entries.get(i) else {
            return Err(PyValueError::new_err(format!("no node {i}")));
        };
        Ok(child_indices(i, entry.arity(), |j| self.entries[j].size()))
    }

    /// Rebuild the tree; `objects` receives the object built at each entry.
    fn build<'py>(
        &self,
        py: Python<'py>,
        leaves: &[Bound<'py, PyAny>],
        mut objects: Option<&mut Vec<Bound<'py, PyAny>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if leaves.len() != self.num_slots {
            return Err(leaf_count_error(self.num_slots, leaves.len()));
        }
        // Built objects by entry index, for `Ref`s and for `objects`.
        let mut built: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.entries.len());
        let mut stack: Vec<Bound<'py, PyAny>> = Vec::with_capacity(16);
        for entry in &self.entries {
            let obj = match entry {
                Entry::Leaf(slot) => leaves[*slot].clone(),
                Entry::Ref(target) => built[*target].clone(),
                Entry::Node(node) => {
                    let start = stack.len() - node.arity;
                    build_node(py, &node.kind, stack.drain(start..))?
                }
            };
            stack.push(obj.clone());
            built.push(obj);
        }
        if let Some(objects) = objects.as_mut() {
            objects.extend(built);
        }
        Ok(stack.pop().expect("one root"))
    }

    /// Slots of the leaves under entry `i` (following references).
    fn slots_under(&self, i: usize) -> PyResult<Vec<usize>> {
        let mut out = Vec::new();
        let mut agenda = vec![i];
        while let Some(n) = agenda.pop() {
            match &self.entries[n] {
                Entry::Leaf(s) => out.push(*s),
                Entry::Ref(t) => agenda.push(*t),
                Entry::Node(_) => agenda.extend(self.child_indices(n)?),
            }
        }
        Ok(out)
    }
}

impl Structure for SharedTreeDef {
    fn hash_cell(&self) -> &OnceLock<isize> {
        &self.hash
    }

    fn hash_nodes(&self, py: Python<'_>, h: &mut impl Hasher) -> PyResult<()> {
        self.num_slots.hash(h);
        for e in &self.entries {
            match e {
                Entry::Leaf(s) => (0u8, *s).hash(h),
                Entry::Ref(t) => (1u8, *t).hash(h),
                Entry::Node(n) => {
                    2u8.hash(h);
                    n.hash_into(py, h)?;
                }
            }
        }
        Ok(())
    }

    fn same_nodes(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        if self.num_slots != other.num_slots || self.entries.len() != other.entries.len() {
            return Ok(false);
        }
        for (a, b) in self.entries.iter().zip(&other.entries) {
            let equal = match (a, b) {
                (Entry::Leaf(x), Entry::Leaf(y)) | (Entry::Ref(x), Entry::Ref(y)) => x == y,
                (Entry::Node(x), Entry::Node(y)) => x.same_as(py, y)?,
                _ => false,
            };
            if !equal {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[pymethods]
impl SharedTreeDef {
    /// Number of distinct leaves.
    #[getter]
    fn num_leaves(&self) -> usize {
        self.num_slots
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.entries.len()
    }

    /// Rebuild the tree from its distinct leaves, restoring the sharing.
    fn unflatten<'py>(
        &self,
        py: Python<'py>,
        leaves: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.build(py, &leaves, None)
    }

    /// `(tree, objects)`: the rebuilt tree and the object built at each entry.
    fn unflatten_nodes<'py>(
        &self,
        py: Python<'py>,
        leaves: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
        let mut objects = Vec::with_capacity(self.entries.len());
        let root = self.build(py, &leaves, Some(&mut objects))?;
        Ok((root, PyList::new(py, objects)?))
    }
    /// An `EntryInfo` per entry, in post-order.
    fn node_info(&self, py: Python<'_>) -> PyResult<Vec<EntryInfo>> {
        let mut out = Vec::with_capacity(self.entries.len());
        for (i, e) in self.entries.iter().enumerate() {
            out.push(match e {
                Entry::Leaf(slot) => EntryInfo::Leaf { slot: *slot },
                Entry::Ref(target) => EntryInfo::Ref { target: *target },
                Entry::Node(n) => EntryInfo::Node {
                    node_type: n
                        .kind
                        .node_type(py)
                        .ok_or_else(|| PyValueError::new_err("a leaf entry is not a node"))?
                        .unbind(),
                    arity: n.arity,
                    data: n.kind.raw_data(py).map(Bound::unbind),
                    size: n.num_nodes,
                    children: self.child_indices(i)?,
                },
            });
        }
        Ok(out)
    }

    /// The structure of the tuple `(*a, *b)`, where `a` and `b` are the structures of two
    /// tuples flattened apart (`jit_partial`: the bound arguments, flattened once, and the
    /// call's own). Leaves and containers of `b` are distinct from those of `a`; the caller
    /// checks that they are distinct objects.
    #[staticmethod]
    fn join_tuples(py: Python<'_>, a: &SharedTreeDef, b: &SharedTreeDef) -> PyResult<Self> {
        let root_arity = |d: &SharedTreeDef| match d.entries.last() {
            Some(Entry::Node(n)) if matches!(n.kind, NodeKind::Tuple) => Ok(n.arity),
            _ => Err(PyValueError::new_err(
                "join_tuples: both structures must be tuples",
            )),
        };
        let arity = root_arity(a)? + root_arity(b)?;
        let a_len = a.entries.len() - 1;
        let mut entries = Vec::with_capacity(a_len + b.entries.len());
        let mut num_leaves = 0;
        for (part, entry_offset, slot_offset) in [(a, 0, 0), (b, a_len, a.num_slots)] {
            for e in &part.entries[..part.entries.len() - 1] {
                entries.push(match e {
                    Entry::Leaf(s) => {
                        num_leaves += 1;
                        Entry::Leaf(s + slot_offset)
                    }
                    Entry::Ref(t) => Entry::Ref(t + entry_offset),
                    Entry::Node(n) => Entry::Node(n.clone_ref(py)),
                });
            }
        }
        entries.push(Entry::Node(Node {
            kind: NodeKind::Tuple,
            arity,
            num_leaves,
            num_nodes: entries.len() + 1,
        }));
        Ok(SharedTreeDef::new(entries, a.num_slots + b.num_slots))
    }

    /// Entry indices of entry `i`'s children.
    fn children_of(&self, i: usize) -> PyResult<Vec<usize>> {
        self.child_indices(i)
    }

    /// For each child of entry `i`: the sorted leaf slots in its subtree (references followed).
    fn child_slots(&self, i: usize) -> PyResult<Vec<Vec<usize>>> {
        self.child_indices(i)?
            .into_iter()
            .map(|c| {
                let mut slots = self.slots_under(c)?;
                slots.sort_unstable();
                slots.dedup();
                Ok(slots)
            })
            .collect()
    }

    /// Against another `SharedTreeDef` (anything else: NotImplemented, from PyO3).
    fn __richcmp__(&self, py: Python<'_>, other: &Self, op: CompareOp) -> PyResult<Py<PyAny>> {
        protocol::richcmp(py, self, other, op)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        protocol::hash(py, self)
    }

    fn __repr__(&self) -> String {
        let count = |f: fn(&Entry) -> bool| self.entries.iter().filter(|e| f(e)).count();
        format!(
            "SharedTreeDef({} nodes, {} leaves of which {} distinct, {} shared containers)",
            self.entries.len(),
            count(|e| matches!(e, Entry::Leaf(_))),
            self.num_slots,
            count(|e| matches!(e, Entry::Ref(_))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeKind;

    fn list(arity: usize, num_nodes: usize) -> Entry {
        Entry::Node(Node {
            kind: NodeKind::List,
            arity,
            num_leaves: 0,
            num_nodes,
        })
    }

    /// `[[a, b], <ref to [a, b]>, a]`: post-order a, b, [a, b], ref, a, root.
    fn sample() -> SharedTreeDef {
        SharedTreeDef::new(
            vec![
                Entry::Leaf(0),
                Entry::Leaf(1),
                list(2, 3),
                Entry::Ref(2),
                Entry::Leaf(0),
                list(3, 6),
            ],
            2,
        )
    }

    #[test]
    fn children_skip_whole_subtrees() {
        let def = sample();
        assert_eq!(def.child_indices(5).unwrap(), vec![2, 3, 4]);
        assert_eq!(def.child_indices(2).unwrap(), vec![0, 1]);
        assert!(def.child_indices(0).unwrap().is_empty());
        assert!(def.child_indices(6).is_err());
    }

    #[test]
    fn slots_follow_references() {
        let def = sample();
        let mut under_ref = def.slots_under(3).unwrap();
        under_ref.sort_unstable();
        assert_eq!(under_ref, vec![0, 1]);
        assert_eq!(
            def.child_slots(5).unwrap(),
            vec![vec![0, 1], vec![0, 1], vec![0]]
        );
    }
}
