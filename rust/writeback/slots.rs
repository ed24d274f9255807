//! Setting an attribute that is a slot (a member descriptor, as each nnx `Variable`'s value
//! is) where the instance stores it. A write-back of an nnx step sets one attribute on each of
//! hundreds of Variables; `PyObject_GenericGetAttr` then `PyObject_GenericSetAttr` look the
//! name up along the type's MRO twice and call the descriptor twice for each. Where the
//! lookup finds a plain object slot, what they do comes down to swapping one pointer, so the
//! place is found once per type version and the pointer swapped directly.
//!
//! A type's version tag (`tp_version_tag`, CPython's own key for its attribute cache) changes
//! whenever the type or one of its bases is changed (an attribute set or deleted on the class,
//! `__bases__` assigned), so a place found under a tag stays right for as long as the tag
//! does; a type without a valid tag takes the generic path.

use crate::member::object_member;
use pyo3::exceptions::PyKeyError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};

/// Where instances of one type version store one attribute: `offset` from the object's
/// address, or None where the attribute is not a plain object slot (the generic setter then).
#[derive(Clone, Copy)]
pub(super) struct SlotPlace {
    ty: usize,
    tag: u32,
    /// The attribute's name (a string the plan holds, so the address is not reused).
    name: usize,
    offset: Option<isize>,
}

/// At most this many places are kept per plan (one per Variable type and attribute written,
/// a handful in practice); past it they are found again.
const PLACES: usize = 32;

/// `object.__setattr__(obj, name, value)` where `name` is a plain object slot of `obj`'s type
/// (`places` remembers which types' are): the value replaced is returned (None: the slot was
/// unset). `Ok(None)` with nothing done otherwise, for the generic path.
pub(super) fn swap_slot<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    value: &Bound<'py, PyAny>,
    places: &mut Vec<SlotPlace>,
) -> PyResult<Option<Option<Bound<'py, PyAny>>>> {
    let ty = obj.get_type_ptr();
    // SAFETY: `obj` is alive, so is its type.
    let Some(tag) = (unsafe { version_tag(ty) }) else {
        return Ok(None);
    };
    let key = (ty as usize, tag, name.as_ptr() as usize);
    let found = places.iter().find(|p| (p.ty, p.tag, p.name) == key);
    let offset = match found {
        Some(place) => place.offset,
        None => {
            let offset = find_slot(obj, name)?;
            // Finding it may have run Python code (a metaclass's `__mro__`): the place is
            // kept only if the type version is still the one it was found for.
            // SAFETY: as above.
            if unsafe { version_tag(ty) } != Some(tag) {
                return Ok(None);
            }
            if places.len() >= PLACES {
                places.clear();
            }
            places.push(SlotPlace {
                ty: key.0,
                tag,
                name: key.2,
                offset,
            });
            offset
        }
    };
    let Some(offset) = offset else {
        return Ok(None);
    };
    // SAFETY: `offset` is a plain object slot of this very type version (found above), so the
    // object's memory holds a `PyObject *` (or NULL) there; no Python code runs between the
    // read and the write, and the reference the slot held passes to the caller.
    let before = unsafe {
        let at = obj
            .as_ptr()
            .cast::<u8>()
            .offset(offset)
            .cast::<*mut ffi::PyObject>();
        let before = *at;
        *at = value.clone().into_ptr();
        Bound::from_owned_ptr_or_opt(obj.py(), before)
    };
    Ok(Some(before))
}

/// The offset of `name` in instances of `obj`'s type when `object.__setattr__` would store it
/// in a plain object slot: the type's setter is the generic one (`generic_setattr_applies`),
/// and the first class along the MRO that defines `name` defines it as a writable member
/// descriptor of object type, with no audit hook on reads.
fn find_slot(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> PyResult<Option<isize>> {
    let py = obj.py();
    // SAFETY: `obj` is alive, so is its type.
    if !unsafe { super::generic_setattr_applies(obj.get_type_ptr(), super::python_setattro(py)?) } {
        return Ok(None);
    }
    // The MRO and namespaces `_PyType_Lookup` reads: the type's own, past any metaclass.
    // SAFETY: the type is alive (through `obj`), so is its MRO tuple, taken as a reference.
    let mro = unsafe { (*obj.get_type_ptr()).tp_mro };
    if mro.is_null() {
        return Ok(None);
    }
    let mro = unsafe { Bound::from_borrowed_ptr(py, mro) };
    for class in mro.cast::<PyTuple>()?.iter() {
        let Ok(class) = class.cast_into::<PyType>() else {
            return Ok(None);
        };
        // SAFETY: `class` is alive (held); `tp_dict` is NULL only for static built-in types
        // from 3.12 on, whose namespace `__dict__` then gives.
        let dict = unsafe { (*class.as_type_ptr()).tp_dict };
        let namespace = if dict.is_null() {
            class.getattr(pyo3::intern!(py, "__dict__"))?
        } else {
            unsafe { Bound::from_borrowed_ptr(py, dict) }
        };
        let descr = match namespace.get_item(name) {
            Ok(descr) => descr,
            Err(e) if e.is_instance_of::<PyKeyError>(py) => continue,
            Err(_) => return Ok(None),
        };
        // SAFETY: `descr` is alive (held) while it is read; `obj` is alive.
        return Ok(unsafe {
            object_member(descr.as_ptr(), true)
                .filter(|&(_, class)| ffi::PyObject_TypeCheck(obj.as_ptr(), class) != 0)
                .map(|(offset, _)| offset)
        });
    }
    Ok(None)
}

/// The type's version tag, None when it has no valid one (0; before 3.13 the flag
/// `Py_TPFLAGS_VALID_VERSION_TAG` says so too, and is cleared with it).
///
/// # Safety
/// `ty` must point to a live type object.
unsafe fn version_tag(ty: *mut ffi::PyTypeObject) -> Option<u32> {
    let (tag, _flags) = unsafe { ((*ty).tp_version_tag, (*ty).tp_flags) };
    #[cfg(not(Py_3_13))]
    if _flags & ffi::Py_TPFLAGS_VALID_VERSION_TAG == 0 {
        return None;
    }
    (tag != 0).then_some(tag)
}
