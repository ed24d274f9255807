//! Identity tracking, the primitive of the `alias` and `strict` policies.
//!
//! `Sharing` is a traversal mode: an object met a second time (by identity) is recorded as a
//! reference to its first occurrence, so a shared leaf gets one slot in the leaves list and a
//! shared container becomes a `Ref` entry. Dicts are ordered as JAX orders them (sorted
//! keys), so their insertion order is not part of the structure: a function traced on the
//! rebuilt tree sees them as under `jax.jit`, and the write-back keeps each caller dict's own
//! order. `SharedTreeDef.unflatten` restores the sharing, so a
//! function traced on the rebuilt tree sees `a is b` where its caller did.

mod treedef;

pub use treedef::{Entry, EntryInfo, SharedTreeDef};

use crate::keys::address::AddressMap;
use crate::node::{Node, NodeKind};
use crate::registry::{type_ptr, Kind};
use crate::traverse::{walk, Mode, Options};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// Python scalars are values: CPython shares small ints and interned floats between unrelated
/// places, so their identity says nothing about the caller's intent and is not tracked.
fn is_python_scalar(obj: &Bound<'_, PyAny>) -> bool {
    let ty = type_ptr(obj);
    ty == &raw mut ffi::PyLong_Type
        || ty == &raw mut ffi::PyFloat_Type
        || ty == &raw mut ffi::PyBool_Type
        || ty == &raw mut ffi::PyComplex_Type
}

/// An object met before.
enum Seen {
    /// A finished container: its entry index.
    Node(usize),
    /// A leaf: its slot.
    Leaf(usize),
}

/// The identity-tracking traversal's record. Every object it records stays alive in `objects`
/// until the walk ends, so no address in `seen` can be reused by another object meanwhile.
#[derive(Default)]
pub struct Sharing<'py> {
    /// The distinct leaves, by slot.
    pub leaves: Vec<Bound<'py, PyAny>>,
    pub entries: Vec<Entry>,
    /// The object at each entry: the leaf, the container, or the referenced container.
    pub objects: Vec<Bound<'py, PyAny>>,
    seen: AddressMap<usize, Seen>,
    leaf_entries: usize,
}

impl<'py> Mode<'py> for Sharing<'py> {
    fn leaf(&mut self, obj: Bound<'py, PyAny>, _: &[Py<PyAny>]) -> PyResult<()> {
        let address = obj.as_ptr() as usize;
        let tracked = !is_python_scalar(&obj);
        let seen_at = if tracked {
            match self.seen.get(&address) {
                Some(Seen::Leaf(slot)) => Some(*slot),
                _ => None,
            }
        } else {
            None
        };
        let slot = match seen_at {
            Some(slot) => slot,
            None => {
                let slot = self.leaves.len();
                if tracked {
                    self.seen.insert(address, Seen::Leaf(slot));
                }
                self.leaves.push(obj.clone());
                slot
            }
        };
        self.entries.push(Entry::Leaf(slot));
        self.objects.push(obj);
        self.leaf_entries += 1;
        Ok(())
    }

    fn revisit(&mut self, obj: &Bound<'py, PyAny>, kind: &Kind) -> bool {
        if matches!(kind, Kind::None) {
            return false;
        }
        match self.seen.get(&(obj.as_ptr() as usize)) {
            Some(Seen::Node(first)) => {
                self.entries.push(Entry::Ref(*first));
                self.objects.push(obj.clone());
                true
            }
            // A container still open is met again inside itself: the walk's guard reports
            // the cycle within a few levels.
            _ => false,
        }
    }

    fn node(&mut self, obj: Bound<'py, PyAny>, node: Node) {
        if !matches!(node.kind, NodeKind::None) {
            self.seen
                .insert(obj.as_ptr() as usize, Seen::Node(self.entries.len()));
        }
        self.entries.push(Entry::Node(node));
        self.objects.push(obj);
    }

    fn counts(&self) -> (usize, usize) {
        (self.leaf_entries, self.entries.len())
    }
}

/// Flatten `tree`, recording shared objects once (see the module comment).
pub fn flatten_shared<'py>(tree: &Bound<'py, PyAny>) -> PyResult<Sharing<'py>> {
    flatten_shared_sized(tree, Sizes::default())
}

/// How many entries and distinct leaves a flatten recorded: a caller that flattens trees of
/// one shape again and again (a training loop) sizes the next flatten's buffers with the last
/// one's, so that they never grow during the walk.
#[derive(Clone, Copy, Default)]
pub struct Sizes {
    pub entries: usize,
    pub leaves: usize,
}

/// `flatten_shared`, its buffers made `sizes` large at the start.
pub fn flatten_shared_sized<'py>(tree: &Bound<'py, PyAny>, sizes: Sizes) -> PyResult<Sharing<'py>> {
    let mut out = Sharing {
        leaves: Vec::with_capacity(sizes.leaves),
        entries: Vec::with_capacity(sizes.entries),
        objects: Vec::with_capacity(sizes.entries),
        seen: AddressMap::with_capacity_and_hasher(sizes.entries, Default::default()),
        leaf_entries: 0,
    };
    walk(tree, &Options::default(), &mut out)?;
    Ok(out)
}

/// `(leaves, shared_treedef, objects)`: the distinct leaves, the structure with its sharing,
/// and the object at each entry.
#[pyfunction(name = "flatten_shared")]
pub fn py_flatten_shared<'py>(
    tree: &Bound<'py, PyAny>,
) -> PyResult<(
    Bound<'py, PyList>,
    Bound<'py, SharedTreeDef>,
    Bound<'py, PyList>,
)> {
    flatten_shared(tree)?.into_python(tree.py())
}

impl<'py> Sharing<'py> {
    /// What this flatten recorded, to size the next one (`flatten_shared_sized`).
    pub fn sizes(&self) -> Sizes {
        Sizes {
            entries: self.entries.len(),
            leaves: self.leaves.len(),
        }
    }

    /// `(leaves, shared_treedef, objects)` as Python objects (see `py_flatten_shared`).
    #[allow(clippy::type_complexity)]
    pub fn into_python(
        self,
        py: Python<'py>,
    ) -> PyResult<(
        Bound<'py, PyList>,
        Bound<'py, SharedTreeDef>,
        Bound<'py, PyList>,
    )> {
        let num_slots = self.leaves.len();
        Ok((
            PyList::new(py, self.leaves)?,
            Bound::new(py, SharedTreeDef::new(self.entries, num_slots))?,
            PyList::new(py, self.objects)?,
        ))
    }
}
