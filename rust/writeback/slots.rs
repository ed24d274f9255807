//! Setting an attribute that is a slot (a member descriptor, as each nnx `Variable`'s value
//! is) where the instance stores it. A write-back of an nnx step sets one attribute on each of
//! hundreds of Variables; `PyObject_GenericGetAttr` then `PyObject_GenericSetAttr` look the
//! name up along the type's MRO twice and call the descriptor twice for each. Where the
//! lookup finds a plain object slot, what they do comes down to swapping one pointer, so the
//! place is found once per type version (`cpython::Internals::setattr_place`) and the pointer
//! swapped there. A type without a version, or a process without the internals, takes the
//! generic path.

use crate::cpython::{internals, SlotAt, TypeVersion};
use pyo3::prelude::*;
use pyo3::types::PyString;

/// Where instances of one type version store one attribute: `slot`, or None where the
/// attribute is not a plain object slot (the generic setter then).
#[derive(Clone, Copy)]
pub(super) struct SlotPlace {
    version: TypeVersion,
    /// The attribute's name (a string the plan holds, so the address is not reused).
    name: usize,
    slot: Option<SlotAt>,
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
    let Some(gate) = internals() else {
        return Ok(None);
    };
    let Some(version) = gate.type_version(obj) else {
        return Ok(None);
    };
    let name_at = name.as_ptr() as usize;
    let found = places
        .iter()
        .find(|p| p.version == version && p.name == name_at);
    let slot = match found {
        Some(place) => place.slot,
        None => {
            let Some((version, slot)) = gate.setattr_place(obj, name)? else {
                return Ok(None);
            };
            if places.len() >= PLACES {
                places.clear();
            }
            places.push(SlotPlace {
                version,
                name: name_at,
                slot,
            });
            slot
        }
    };
    // The swap checks the version again (nothing ran since it was read: a few instructions).
    Ok(slot.and_then(|slot| slot.swap(obj, value)))
}
