//! Building a node's Python object from its children (every unflatten ends here).

use super::NodeKind;
use crate::cpython::new_dict;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// `dict[key] = value` without the reference-count round trips of `PyDict::set_item`
/// (unflatten's hot loop: measured 4% of it on dict-heavy trees).
///
/// # Safety
/// `dict` must be an exact `dict` (not a subclass, whose own `__setitem__` would be
/// bypassed), and `key` and `value` must stay alive for the duration of the call.
unsafe fn dict_set_item(
    dict: &Bound<'_, PyDict>,
    key: &Borrowed<'_, '_, PyAny>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    if ffi::PyDict_SetItem(dict.as_ptr(), key.as_ptr(), value.as_ptr()) != 0 {
        return Err(PyErr::fetch(dict.py()));
    }
    Ok(())
}

/// A new tuple or list holding `children`, each moved straight into its slot. PyO3's
/// `PyTuple::new`/`PyList::new` take every element through a `dyn` iterator: on a tree of
/// small lists that cost a quarter of unflatten (docs/benchmarks.md, nested_list_500 against
/// its floor).
pub fn new_sequence<'py>(
    py: Python<'py>,
    list: bool,
    children: std::vec::Drain<'_, Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let n = children.len() as ffi::Py_ssize_t;
    // SAFETY: both return a new reference to a sequence of `n` empty slots, or NULL with an
    // exception set.
    let raw = unsafe {
        if list {
            ffi::PyList_New(n)
        } else {
            ffi::PyTuple_New(n)
        }
    };
    // SAFETY: `raw` is a new reference (or NULL, reported as the exception set).
    let seq = unsafe { Bound::from_owned_ptr_or_err(py, raw)? };
    for (i, child) in children.enumerate() {
        // SAFETY: `seq` is the fresh sequence of `n` slots made above, `i < n` (a drain yields
        // exactly its length), and slot `i` is still empty: SET_ITEM takes over the child's
        // reference. Moving the children off a `Vec` runs no Python code, so nothing can see
        // the sequence before every slot is filled.
        unsafe {
            if list {
                ffi::PyList_SET_ITEM(seq.as_ptr(), i as ffi::Py_ssize_t, child.into_ptr());
            } else {
                ffi::PyTuple_SET_ITEM(seq.as_ptr(), i as ffi::Py_ssize_t, child.into_ptr());
            }
        }
    }
    Ok(seq)
}

/// Build one node's Python object from its already built children (as many as its arity),
/// taken off the end of the builder's stack.
pub fn build_node<'py>(
    py: Python<'py>,
    kind: &NodeKind,
    children: std::vec::Drain<'_, Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match kind {
        NodeKind::Leaf => {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "internal error: a leaf is not a container",
            ))
        }
        NodeKind::None => py.None().into_bound(py),
        NodeKind::Tuple => new_sequence(py, false, children)?,
        NodeKind::List => new_sequence(py, true, children)?,
        NodeKind::Dict(keys) => {
            let keys = keys.bind(py);
            let dict = new_dict(py, children.len())?;
            for (key, value) in keys.iter_borrowed().zip(children) {
                // SAFETY: `dict` is an exact dict we own; the treedef holds `keys`, so each
                // borrowed key stays alive across the call, even if its `__hash__`/`__eq__`
                // run Python code (which cannot reach that tuple).
                unsafe { dict_set_item(&dict, &key, &value)? };
            }
            dict.into_any()
        }
        NodeKind::NamedTuple(ty) => ty.bind(py).call1(PyTuple::new(py, children)?)?,
        NodeKind::Custom(custom, aux) => custom
            .unflatten
            .bind(py)
            .call1((aux.bind(py), PyTuple::new(py, children)?))?,
    })
}
