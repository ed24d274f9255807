//! The call running now in this thread, for the inner function's trace to read (its debug
//! info names the caller's arguments): set around each run of an inner `jax.jit`, restored
//! after, so a call made while tracing another finds its own. A native slot: a
//! `threading.local` cost two attribute writes a call.

use pyo3::prelude::*;
use std::cell::RefCell;

thread_local! {
    static RUNNING: RefCell<Option<Py<PyAny>>> = const { RefCell::new(None) };
}

/// Put `call` in the slot (None empties it); returns what it held.
pub(crate) fn swap(call: Option<Py<PyAny>>) -> Option<Py<PyAny>> {
    // No Python code runs while the cell is borrowed: the old value is dropped by the caller.
    RUNNING.with(|slot| slot.replace(call))
}

/// The call running now in this thread: what `swap_running_call` or a lean call put there
/// (a `JitCall`, or the lean path's record tuple), or None.
#[pyfunction]
pub fn running_call(py: Python<'_>) -> Option<Py<PyAny>> {
    RUNNING.with(|slot| slot.borrow().as_ref().map(|call| call.clone_ref(py)))
}

/// Put `call` in the running call's slot (None empties it); returns what it held, to be put
/// back when the call ends.
#[pyfunction]
pub fn swap_running_call(call: Option<Py<PyAny>>) -> Option<Py<PyAny>> {
    swap(call)
}
