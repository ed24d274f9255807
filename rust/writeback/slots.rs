//! Setting an attribute that is a slot (a member descriptor, as each nnx `Variable`'s value
//! is) where the instance stores it. A write-back of an nnx step sets one attribute on each of
//! hundreds of Variables; `PyObject_GenericGetAttr` then `PyObject_GenericSetAttr` look the
//! name up along the type's MRO twice and call the descriptor twice for each. Where the
//! lookup finds a plain object slot, what they do comes down to swapping one pointer, so the
//! place is found once per type version and the pointer swapped directly.
//!
//! A place is kept under the type's version tag (`member::version_tag`); a type without a
//! valid tag takes the generic path.

use crate::member::{for_type_version, python_slots, slot_offset, slot_ptr, version_tag};
use pyo3::prelude::*;
use pyo3::types::PyString;

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
            let Some((tag, offset)) = for_type_version(obj, || find_slot(obj, name)) else {
                return Ok(None);
            };
            let offset = offset?;
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
    // SAFETY: `offset` is a plain object slot of this very type version (found above); no
    // Python code runs between the read and the write, and the reference the slot held passes
    // to the caller.
    let before = unsafe {
        let at = slot_ptr(obj.as_ptr(), offset);
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
    // SAFETY: `obj` is alive, so is its type.
    if !unsafe {
        super::generic_setattr_applies(obj.get_type_ptr(), python_slots(obj.py())?.setattro)
    } {
        return Ok(None);
    }
    Ok(slot_offset(obj, name, true))
}
