//! The reads of CPython's private layouts, compiled only for the interpreters they were
//! checked on (build.rs's `cpython_layouts`: CPython 3.11 to 3.13, with the GIL). Each is an
//! `unsafe fn` whose `# Safety` says what the caller must hold; the safe wrappers around them
//! are in `types.rs`, `members.rs` and `dicts.rs`, their tests beside the wrappers. Each takes
//! an `Internals`: leave, given by `super::internals` only while the reads are on.

use super::members::Member;
use super::Internals;
use pyo3::ffi;
use std::num::NonZeroU32;

/// The proof inside an `Internals` that the layouts are compiled in (`no_layouts.rs` has an
/// empty one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified;

/// The proof, when the reads are on.
#[inline]
pub fn verified(on: bool) -> Option<Verified> {
    on.then_some(Verified)
}

/// The type's version tag (`tp_version_tag`), None when it has no valid one (0; before 3.13
/// the flag `Py_TPFLAGS_VALID_VERSION_TAG` says so too, and is cleared with it). CPython
/// renews it whenever the type or one of its bases changes (an attribute set or deleted on
/// the class, `__bases__` assigned) and takes every tag from one counter, so a tag names one
/// version of one type for the life of the process.
///
/// # Safety
/// `ty` must point to a live type object.
#[inline]
pub unsafe fn type_version_tag(_: Internals, ty: *mut ffi::PyTypeObject) -> Option<NonZeroU32> {
    let (tag, _flags) = unsafe { ((*ty).tp_version_tag, (*ty).tp_flags) };
    #[cfg(not(Py_3_13))]
    if _flags & ffi::Py_TPFLAGS_VALID_VERSION_TAG == 0 {
        return None;
    }
    NonZeroU32::new(tag)
}

/// The address of the type's `tp_getattro` (0: none).
///
/// # Safety
/// `ty` must point to a live type object.
#[inline]
pub unsafe fn getattro(_: Internals, ty: *mut ffi::PyTypeObject) -> usize {
    unsafe { (*ty).tp_getattro }.map_or(0, |f| f as usize)
}

/// The address of the type's `tp_setattro` (0: none).
///
/// # Safety
/// `ty` must point to a live type object.
#[inline]
pub unsafe fn setattro(_: Internals, ty: *mut ffi::PyTypeObject) -> usize {
    unsafe { (*ty).tp_setattro }.map_or(0, |f| f as usize)
}

/// The type's `tp_base` (its `__base__`; NULL for `object`), borrowed.
///
/// # Safety
/// `ty` must point to a live type object; its base lives as long as it does.
#[inline]
pub unsafe fn base(_: Internals, ty: *mut ffi::PyTypeObject) -> *mut ffi::PyTypeObject {
    unsafe { (*ty).tp_base }
}

/// The type's `tp_mro` (the tuple `__mro__` gives; NULL while the type is being made),
/// borrowed.
///
/// # Safety
/// `ty` must point to a live type object; take a reference to the result before any Python
/// code runs.
#[inline]
pub unsafe fn mro(_: Internals, ty: *mut ffi::PyTypeObject) -> *mut ffi::PyObject {
    unsafe { (*ty).tp_mro }
}

/// The type's own namespace, `tp_dict` (what `__dict__` wraps), borrowed; NULL for the
/// static built-in types from 3.12 on, which keep it per interpreter.
///
/// # Safety
/// `ty` must point to a live type object; take a reference to the result before any Python
/// code runs.
#[inline]
pub unsafe fn type_dict(_: Internals, ty: *mut ffi::PyTypeObject) -> *mut ffi::PyObject {
    unsafe { (*ty).tp_dict }
}

/// The member `descr` describes, when it is a member descriptor.
///
/// # Safety
/// `descr` must point to a live object.
#[inline]
pub unsafe fn member(_: Internals, descr: *mut ffi::PyObject) -> Option<Member> {
    unsafe {
        if ffi::Py_TYPE(descr) != std::ptr::addr_of_mut!(ffi::PyMemberDescr_Type) {
            return None;
        }
        let descr = &*descr.cast::<ffi::PyMemberDescrObject>();
        let member = descr.d_member.as_ref()?;
        let refused = ffi::Py_AUDIT_READ | ffi::Py_RELATIVE_OFFSET;
        Some(Member {
            class: descr.d_common.d_type,
            offset: member.offset,
            plain_object: member.type_code == ffi::Py_T_OBJECT_EX && member.flags & refused == 0,
            read_only: member.flags & ffi::Py_READONLY != 0,
        })
    }
}

/// The place of an object member's value in `obj`: the `PyObject *` (NULL: unset) at
/// `offset`.
///
/// # Safety
/// `offset` must be where `obj` stores a plain object member (`member`: the member's offset,
/// `obj` an instance of its class). What the place holds is borrowed and may dangle once any
/// Python code runs: only compare it, swap it, or take a reference at once.
#[inline]
pub unsafe fn slot(
    _: Internals,
    obj: *mut ffi::PyObject,
    offset: isize,
) -> *mut *mut ffi::PyObject {
    unsafe { obj.cast::<u8>().offset(offset).cast::<*mut ffi::PyObject>() }
}

/// The dict's PEP 509 version (`ma_version_tag`): a new value from a global counter at every
/// change of its items, so an equal version means the same items. Read on 3.11 and 3.12 only:
/// on 3.13, setting an attribute of an object whose `__dict__` was made leaves the version as
/// it was (and 3.14 has none); there 0, "none to go by"
/// (`test_every_change_to_a_watched_dict_is_seen` in `tests/jit/test_jit_partial.py`).
///
/// # Safety
/// `dict` must point to a live dict (or dict subclass: same layout).
#[inline]
pub unsafe fn dict_version(_: Internals, dict: *mut ffi::PyObject) -> u64 {
    #[cfg(not(Py_3_13))]
    // The field is deprecated from 3.12 (to go in 3.14), still kept up to date in 3.12.
    #[allow(deprecated)]
    return unsafe { (*dict.cast::<ffi::PyDictObject>()).ma_version_tag };
    #[cfg(Py_3_13)]
    {
        let _ = dict;
        0
    }
}

#[cfg(not(Py_3_13))]
extern "C" {
    // Exported by CPython 3.8-3.12 (Include/cpython/dictobject.h), private from 3.13: a dict
    // with room for `minused` items, so filling a wide dict does not resize it over and over.
    fn _PyDict_NewPresized(minused: ffi::Py_ssize_t) -> *mut ffi::PyObject;
}

/// A new empty exact dict with room for `size` items (3.13 does not export the function: an
/// empty dict there): a new reference, or NULL with an exception set.
///
/// # Safety
/// The GIL must be held.
#[inline]
pub unsafe fn presized_dict(_: Internals, size: usize) -> *mut ffi::PyObject {
    #[cfg(not(Py_3_13))]
    return unsafe { _PyDict_NewPresized(size as ffi::Py_ssize_t) };
    #[cfg(Py_3_13)]
    {
        let _ = size;
        unsafe { ffi::PyDict_New() }
    }
}
