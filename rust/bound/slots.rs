//! An object's slots: their member descriptors, found along the type's MRO, and each value
//! read where the object stores it (or through the descriptor), recorded and checked.

use super::follow::LeafIndex;
use super::watched::Layout;
use crate::cpython::{Internals, SlotAt};
use pyo3::exceptions::PyAttributeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

/// A watched slot: its member descriptor, the value it held (None: unset), where the
/// descriptor is a plain object member of a class the object is an instance of, the place in
/// the object where the value is stored under the object's `Layout`, read there while it
/// holds (three slots of each nnx Variable at every `jit_partial` call), and the index among
/// the bound leaves of the value it held, if it is one (`LeafIndex`).
pub(super) struct SlotValue {
    pub(super) descr: Py<PyAny>,
    pub(super) value: Option<Py<PyAny>>,
    pub(super) at: Option<SlotAt>,
    pub(super) leaf: Option<u32>,
}

impl SlotValue {
    /// The slot of `descr` on `obj`, read now (`layout`: the object's, `index`: the bound
    /// leaves).
    pub(super) fn read(
        gate: Internals,
        layout: &Layout,
        obj: &Bound<'_, PyAny>,
        descr: Bound<'_, PyAny>,
        index: &LeafIndex,
    ) -> PyResult<SlotValue> {
        let at = (gate.slot_at(obj, &descr, false)).filter(|at| at.version() == layout.version);
        let value = match at.and_then(|at| at.read(obj)) {
            Some(value) => value,
            None => read_slot(obj, &descr)?,
        };
        let value = value.map(Bound::unbind);
        Ok(SlotValue {
            descr: descr.unbind(),
            leaf: value.as_ref().and_then(|v| index.get(v)),
            value,
            at,
        })
    }

    /// Whether the slot still holds its value, by identity, and the object's `layout` still
    /// holds (asked for each slot: a read through a descriptor may run Python code), without
    /// taking a reference where the value is read in the object.
    pub(super) fn holds(
        &self,
        gate: Internals,
        layout: &Layout,
        obj: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let value = self.value.as_ref().map_or(std::ptr::null_mut(), Py::as_ptr);
        if let Some(at) = self.at {
            // Under the layout's version (checked by `holds`): where the object stores it.
            return Ok(at.holds(obj, value));
        }
        if !layout.holds(obj) {
            return Ok(false);
        }
        let descr = self.descr.bind(obj.py());
        if let Some(held) = gate.member_value(obj, descr) {
            return Ok(held == value);
        }
        Ok(match (read_slot(obj, descr)?, &self.value) {
            (Some(a), Some(b)) => a.is(b),
            (None, None) => true,
            _ => false,
        })
    }
}

/// The value of the slot whose member descriptor is `descr` on `obj`, or None when unset:
/// read through the descriptor itself, as `object.__getattribute__` would after finding it,
/// past a class's own `__getattribute__` (nnx's `Variable` has one: Python code there would
/// cost more than the rest of the check).
pub(super) fn read_slot<'py>(
    obj: &Bound<'py, PyAny>,
    descr: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    // SAFETY: `descr` is alive, so is its type; `PyType_GetSlot` (public, any type from 3.10)
    // gives its `tp_descr_get`, NULL for none, which `Option` of a function pointer stands for.
    let get = unsafe {
        let slot = ffi::PyType_GetSlot(ffi::Py_TYPE(descr.as_ptr()), ffi::Py_tp_descr_get);
        std::mem::transmute::<*mut std::ffi::c_void, Option<ffi::descrgetfunc>>(slot)
    };
    let Some(get) = get else {
        return Ok(Some(descr.clone())); // not a descriptor any more: a plain class attribute
    };
    // SAFETY: all three pointers come from live objects and the GIL is held; the result is a
    // new reference or NULL with an exception set, which `from_owned_ptr_or_err` takes over.
    let value = unsafe {
        let ty = pyo3::ffi::Py_TYPE(obj.as_ptr()).cast::<pyo3::ffi::PyObject>();
        Bound::from_owned_ptr_or_err(py, get(descr.as_ptr(), obj.as_ptr(), ty))
    };
    match value {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(super) fn slot_values<'py>(
    gate: Internals,
    layout: &Layout,
    obj: &Bound<'py, PyAny>,
    descrs: Vec<Bound<'py, PyAny>>,
    index: &LeafIndex,
) -> PyResult<Vec<SlotValue>> {
    descrs
        .into_iter()
        .map(|descr| SlotValue::read(gate, layout, obj, descr, index))
        .collect()
}

/// The member descriptors of the slots of `ty` and its bases.
pub(super) fn slot_descriptors<'py>(ty: &Bound<'py, PyType>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = ty.py();
    let mut descrs = Vec::new();
    for klass in ty.getattr(pyo3::intern!(py, "__mro__"))?.try_iter()? {
        let klass = klass?;
        let namespace = klass.getattr(pyo3::intern!(py, "__dict__"))?;
        let Ok(slots) = namespace.get_item("__slots__") else {
            continue;
        };
        let slots: Vec<Bound<'py, PyAny>> = if slots.is_instance_of::<PyString>() {
            vec![slots]
        } else {
            slots.try_iter()?.collect::<PyResult<_>>()?
        };
        let class_name: String = klass.getattr(pyo3::intern!(py, "__name__"))?.extract()?;
        for slot in slots {
            let name: String = slot.extract()?;
            if name == "__dict__" || name == "__weakref__" {
                continue;
            }
            // Private names are stored mangled, as Python stores them.
            let stored = if name.starts_with("__") && !name.ends_with("__") {
                format!("_{}{}", class_name.trim_start_matches('_'), name)
            } else {
                name
            };
            if let Ok(descr) = namespace.get_item(&stored) {
                descrs.push(descr);
            }
        }
    }
    Ok(descrs)
}
