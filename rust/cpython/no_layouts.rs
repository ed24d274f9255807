//! `layouts.rs` for an interpreter whose layouts were not checked (build.rs: CPython 3.14 and
//! later, a free-threaded build, the stable ABI): the same names, and no read. `Verified` has
//! no value, so no `Internals` exists and none of these can be called.

use super::members::Member;
use super::Internals;
use pyo3::ffi;
use std::num::NonZeroU32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {}

#[inline]
pub fn verified(_on: bool) -> Option<Verified> {
    None
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn type_version_tag(gate: Internals, _: *mut ffi::PyTypeObject) -> Option<NonZeroU32> {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn getattro(gate: Internals, _: *mut ffi::PyTypeObject) -> usize {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn setattro(gate: Internals, _: *mut ffi::PyTypeObject) -> usize {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn base(gate: Internals, _: *mut ffi::PyTypeObject) -> *mut ffi::PyTypeObject {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn mro(gate: Internals, _: *mut ffi::PyTypeObject) -> *mut ffi::PyObject {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn type_dict(gate: Internals, _: *mut ffi::PyTypeObject) -> *mut ffi::PyObject {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn member(gate: Internals, _: *mut ffi::PyObject) -> Option<Member> {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn slot(gate: Internals, _: *mut ffi::PyObject, _: isize) -> *mut *mut ffi::PyObject {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn dict_version(gate: Internals, _: *mut ffi::PyObject) -> u64 {
    match gate.0 {}
}

/// # Safety
/// Cannot be called (no `Internals` exists).
pub unsafe fn presized_dict(gate: Internals, _: usize) -> *mut ffi::PyObject {
    match gate.0 {}
}
