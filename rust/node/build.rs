//! Building a node's Python object from its children (every unflatten ends here).

use super::NodeKind;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

#[cfg(not(Py_3_13))]
extern "C" {
    // Exported by CPython 3.8-3.12 (Include/cpython/dictobject.h): a dict with room for
    // `minused` items, so filling a wide dict does not resize it over and over.
    fn _PyDict_NewPresized(minused: ffi::Py_ssize_t) -> *mut ffi::PyObject;
}

/// An empty dict with room for `size` items.
pub fn new_dict(py: Python<'_>, size: usize) -> PyResult<Bound<'_, PyDict>> {
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

/// Build one node's Python object from its already built children (as many as its arity).
pub fn build_node<'py>(
    py: Python<'py>,
    kind: &NodeKind,
    children: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match kind {
        NodeKind::Leaf => {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "internal error: a leaf is not a container",
            ))
        }
        NodeKind::None => py.None().into_bound(py),
        NodeKind::Tuple => PyTuple::new(py, children)?.into_any(),
        NodeKind::List => PyList::new(py, children)?.into_any(),
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
