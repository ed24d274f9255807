//! The floor of unflatten, for the tree benchmark (`benches/tree_table.py`): the least work
//! any unflatten must do, which is to create the same Python objects. No check beyond what
//! memory safety needs, raw CPython calls, one pass over the nodes. treeclone's own unflatten
//! is reported as a ratio to it, so that what is left to gain is measured, not guessed.

use super::PyTreeDef;
use crate::cpython::new_dict;
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
            // SAFETY: the stack holds owned references to live objects; the GIL is held.
            NodeKind::Tuple => unsafe { steal_top(py, &mut stack, start, Sequence::Tuple)? },
            // SAFETY: as for a tuple.
            NodeKind::List => unsafe { steal_top(py, &mut stack, start, Sequence::List)? },
            NodeKind::Dict(keys) => {
                let d = new_dict(py, node.arity)?;
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
                let mut children: Vec<Bound<'py, PyAny>> = stack
                    .0
                    .drain(start..)
                    .map(|p| unsafe { Bound::from_owned_ptr(py, p) })
                    .collect();
                build_node(py, kind, children.drain(..))?
            }
        };
        stack.0.push(obj.into_ptr());
    }
    let root = stack.0.pop().expect("one root");
    // SAFETY: `root` is an owned reference taken off the stack.
    Ok(unsafe { Bound::from_owned_ptr(py, root) })
}

enum Sequence {
    Tuple,
    List,
}

/// A new tuple or list that takes over the references on `stack` from `start` on (they leave
/// the stack; on failure they stay there, to be released with it).
///
/// # Safety
/// Every pointer on `stack` must be an owned reference to a live object and the GIL must be
/// held.
unsafe fn steal_top<'py>(
    py: Python<'py>,
    stack: &mut Owned,
    start: usize,
    kind: Sequence,
) -> PyResult<Bound<'py, PyAny>> {
    let n = (stack.0.len() - start) as ffi::Py_ssize_t;
    let container = match kind {
        Sequence::Tuple => unsafe { ffi::PyTuple_New(n) },
        Sequence::List => unsafe { ffi::PyList_New(n) },
    };
    if container.is_null() {
        return Err(PyErr::fetch(py));
    }
    for (i, &child) in stack.0[start..].iter().enumerate() {
        let i = i as ffi::Py_ssize_t;
        match kind {
            Sequence::Tuple => unsafe { ffi::PyTuple_SET_ITEM(container, i, child) },
            Sequence::List => unsafe { ffi::PyList_SET_ITEM(container, i, child) },
        }
    }
    stack.0.truncate(start); // stolen by the container: not released here
    Ok(unsafe { Bound::from_owned_ptr(py, container) })
}

/// Owned references, released when dropped (also on an early error return).
struct Owned(Vec<*mut ffi::PyObject>);

impl Owned {
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
