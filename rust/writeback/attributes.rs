//! Attributes set directly on the caller's objects (an nnx Variable's value): past a class's
//! own `__setattr__`, as `object.__setattr__` sets them, with the values they replaced kept.

use super::slots::{swap_slot, SlotPlace};
use super::undo::Undo;
use crate::cpython::internals;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;

/// `object.__setattr__`, which sets an attribute as `write_custom` does: past a class's own
/// `__setattr__` (frozen dataclasses, nnx's trace-level checks), as if the function had run on
/// the caller's object.
pub(super) fn object_setattr(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static SETATTR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    SETATTR
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.get_type::<PyAny>().getattr("__setattr__")?.unbind())
        })
        .map(|f| f.bind(py))
}

/// `object.__setattr__(obj, name, value)`. Called for every attribute a write-back sets (each
/// nnx Variable written): where that is the generic setter (`generic_setattr_applies`, read
/// in CPython's internals), it is called directly, without the Python call (a tuple, a bound
/// method-wrapper and a second tuple each time).
pub(super) fn set_attribute<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    value: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let py = obj.py();
    let generic = match internals() {
        Some(gate) => gate.generic_setattr_applies(obj)?,
        None => false,
    };
    if !generic {
        return object_setattr(py)?.call1((obj, name, value)).map(|_| ());
    }
    // SAFETY: all three are alive (borrowed for the call) and the GIL is held; the setter may
    // run Python code (a descriptor's `__set__`, the finalizer of the value replaced), which
    // takes references of its own to what it keeps.
    if unsafe { pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) }
        < 0
    {
        return Err(PyErr::fetch(py));
    }
    Ok(())
}

/// Put back attributes set by [`write_attributes`]: old values, and none where there was none.
pub(super) fn restore_attributes<'py>(
    obj: &Bound<'py, PyAny>,
    old: Vec<(Bound<'py, PyString>, Option<Bound<'py, PyAny>>)>,
) -> PyResult<()> {
    let py = obj.py();
    for (name, value) in old.into_iter().rev() {
        match value {
            Some(v) => set_attribute(obj, &name, &v)?,
            None => {
                let delattr = py.get_type::<PyAny>().getattr("__delattr__")?;
                if let Err(e) = delattr.call1((obj, name)) {
                    if !e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) {
                        return Err(e);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Set `obj.<name> = children[j]` for each `(name, j)` of `direct`; returns how to undo it
/// (also the part done when a later attribute fails).
pub(super) fn write_attributes<'py>(
    obj: &Bound<'py, PyAny>,
    direct: &[(Py<PyString>, usize)],
    children: &[Bound<'py, PyAny>],
    places: &mut Vec<SlotPlace>,
) -> PyResult<Undo<'py>> {
    if let [(name, j)] = direct {
        let (name, before) = write_attribute(obj, name, *j, children, places)?;
        return Ok(Undo::Attribute(obj.clone(), name, before));
    }
    let mut old = Vec::with_capacity(direct.len());
    let written = direct.iter().try_for_each(|(name, j)| {
        old.push(write_attribute(obj, name, *j, children, places)?);
        Ok(())
    });
    Undo::Attributes(obj.clone(), old).kept_or_applied(written)
}

/// Set `obj.<name> = children[j]`; returns the name and the value it replaced (None: none).
pub(super) fn write_attribute<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Py<PyString>,
    j: usize,
    children: &[Bound<'py, PyAny>],
    places: &mut Vec<SlotPlace>,
) -> PyResult<(Bound<'py, PyString>, Option<Bound<'py, PyAny>>)> {
    let py = obj.py();
    let name = name.bind(py);
    let Some(value) = children.get(j) else {
        return Err(PyValueError::new_err(
            "CallPlan: a direct write names a child the node does not have",
        ));
    };
    if let Some(before) = swap_slot(obj, name, value, places)? {
        return Ok((name.clone(), before));
    }
    // Read as `object.__getattribute__` reads it, the value `set_attribute`'s generic setter
    // replaces (and the undo puts back), past a class's own `__getattr__` hook.
    // SAFETY: `obj` and `name` are alive (borrowed) and the GIL is held; the result is a new
    // reference or NULL with an exception set, which `from_owned_ptr_or_err` takes over.
    let read = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyObject_GenericGetAttr(obj.as_ptr(), name.as_ptr()),
        )
    };
    let before = match read {
        Ok(v) => Some(v),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => None,
        Err(e) => return Err(e),
    };
    set_attribute(obj, name, value)?;
    Ok((name.clone(), before))
}
