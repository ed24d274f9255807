//! The floor of unflatten, for the tree benchmark (`benches/tree_table.py`): the least work
//! any unflatten must do, which is to create the same Python objects. No check beyond what
//! memory safety needs, raw CPython calls, one pass over the nodes. treeclone's own unflatten
//! is reported as a ratio to it, so that what is left to gain is measured, not guessed.

use super::PyTreeDef;
use crate::node::{build_node, NodeKind};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// `treedef.unflatten(leaves)` by the shortest path: a benchmark reference, not an API.
///
/// >>> import treeclone.tree_util as tu
/// >>> from treeclone import _native
/// >>> leaves, treedef = tu.tree_flatten({"b": (1, 2), "a": [3, None]})
/// >>> _native.unflatten_floor(treedef, leaves)
/// {'a': [3, None], 'b': (1, 2)}
#[pyfunction]
pub fn unflatten_floor<'py>(
    def: &Bound<'py, PyTreeDef>,
    leaves: &Bound<'py, PyList>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = leaves.py();
    let def = def.borrow();
    let expected = def.root().num_leaves;
    if leaves.len() != expected {
        return Err(super::leaf_count_error(expected, leaves.len()));
    }
    let mut stack = Owned(Vec::with_capacity(def.nodes.len()));
    let mut next = 0;
    for node in &def.nodes {
        let start = stack.0.len() - node.arity;
        let obj = match &node.kind {
            // A custom unflatten met earlier may have changed the list: read it with its
            // current bounds.
            NodeKind::Leaf => {
                next += 1;
                leaves.get_item(next - 1)?
            }
            NodeKind::None => py.None().into_bound(py),
            NodeKind::Tuple => {
                // SAFETY: the stack holds owned references to live objects; the GIL is held.
                unsafe { steal_into_tuple(py, stack.0.drain(start..).collect())? }
            }
            NodeKind::List => {
                // SAFETY: as for a tuple.
                unsafe { steal_into_list(py, stack.0.drain(start..).collect())? }
            }
            NodeKind::Dict(keys) => {
                let d = pyo3::types::PyDict::new(py);
                for (key, child) in keys.bind(py).iter_borrowed().zip(&stack.0[start..]) {
                    // SAFETY: `d` is a live dict, `key` is held by the treedef and `child` by
                    // the stack for the whole call.
                    if unsafe { ffi::PyDict_SetItem(d.as_ptr(), key.as_ptr(), *child) } < 0 {
                        return Err(PyErr::fetch(py));
                    }
                }
                stack.release_from(start);
                d.into_any()
            }
            kind => {
                // SAFETY: the stack's pointers are owned references, handed over to Bounds.
                let children: Vec<Bound<'py, PyAny>> = stack
                    .0
                    .drain(start..)
                    .map(|p| unsafe { Bound::from_owned_ptr(py, p) })
                    .collect();
                build_node(py, kind, children.into_iter())?
            }
        };
        stack.0.push(obj.into_ptr());
    }
    let root = stack.0.pop().expect("one root");
    // SAFETY: `root` is an owned reference taken off the stack.
    Ok(unsafe { Bound::from_owned_ptr(py, root) })
}

/// A new tuple that takes over `children`.
///
/// # Safety
/// Each pointer must be an owned reference to a live object and the GIL must be held. The
/// references are stolen: by the tuple, or released if it cannot be made.
unsafe fn steal_into_tuple<'py>(
    py: Python<'py>,
    children: Vec<*mut ffi::PyObject>,
) -> PyResult<Bound<'py, PyAny>> {
    let children = Owned(children);
    let t = unsafe { ffi::PyTuple_New(children.0.len() as ffi::Py_ssize_t) };
    if t.is_null() {
        return Err(PyErr::fetch(py));
    }
    for (i, child) in children.into_inner().into_iter().enumerate() {
        unsafe { ffi::PyTuple_SET_ITEM(t, i as ffi::Py_ssize_t, child) };
    }
    Ok(unsafe { Bound::from_owned_ptr(py, t) })
}

/// A new list that takes over `children`.
///
/// # Safety
/// As for [`steal_into_tuple`].
unsafe fn steal_into_list<'py>(
    py: Python<'py>,
    children: Vec<*mut ffi::PyObject>,
) -> PyResult<Bound<'py, PyAny>> {
    let children = Owned(children);
    let l = unsafe { ffi::PyList_New(children.0.len() as ffi::Py_ssize_t) };
    if l.is_null() {
        return Err(PyErr::fetch(py));
    }
    for (i, child) in children.into_inner().into_iter().enumerate() {
        unsafe { ffi::PyList_SET_ITEM(l, i as ffi::Py_ssize_t, child) };
    }
    Ok(unsafe { Bound::from_owned_ptr(py, l) })
}

/// Owned references, released when dropped (also on an early error return).
struct Owned(Vec<*mut ffi::PyObject>);

impl Owned {
    /// The references, no longer released by this.
    fn into_inner(mut self) -> Vec<*mut ffi::PyObject> {
        std::mem::take(&mut self.0)
    }

    /// Release the references from `start` on.
    fn release_from(&mut self, start: usize) {
        for p in self.0.drain(start..) {
            // SAFETY: each pointer is an owned reference (see `unflatten_floor`).
            unsafe { ffi::Py_DecRef(p) };
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.release_from(0);
    }
}
