//! The call of a jitted function: `JitCore` (`treeclone.Jitted`'s native base, its
//! `__call__`), `PartialCore` (`treeclone.JitPartial`'s), `StageCall` (a traced or compiled
//! stage's call, `stage.rs`), and the one native call all three make under a policy other
//! than `clone`, `LeanCall` (`lean/`: the call, its key in `key.rs`), with what it shares: the static arguments taken out (`statics.rs`), the call running now
//! for the trace's debug info (`running.rs`), `jit_partial`'s bound arguments joined with a
//! call's own and followed through its write-back (`bound_args.rs`), the inner jit's result
//! box and the errors that hand a call back to Python; and `treeclone.jit`'s cache of its
//! leading arguments' flatten, the same machinery in weak mode (`kept.rs`).

pub(crate) mod bound_args;
mod core;
mod kept;
mod lean;
mod partial;
pub(crate) mod running;
mod stage;
mod statics;

pub use core::JitCore;
pub use lean::LeanCall;
pub use partial::PartialCore;
pub use stage::StageCall;
pub use statics::StaticArguments;

use pyo3::exceptions::PyValueError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::PyTraverseError;
use std::sync::Mutex;

pyo3::create_exception!(
    treeclone,
    FlattenFailed,
    PyValueError,
    "The arguments of a native call could not be flattened (or differ from a stage's): \
     Python words the error, naming the argument."
);

pyo3::create_exception!(
    treeclone,
    ShardedArguments,
    FlattenFailed,
    "A call's arguments hold arrays placed on several devices and its key holds no shardings \
     (the arrays written back keep their placement, a part of the trace): the call is made \
     again with them in its key, and so are the later ones."
);

/// Put `value` in `last`, what a call remembers of the last one (a key, a split of its
/// arguments, a trace's info). The old value is dropped after the lock is let go: its
/// decrefs may run a finalizer that calls back and takes the lock. A poisoned lock keeps
/// nothing.
#[inline]
fn replace_last<T>(last: &Mutex<Option<T>>, value: T) {
    let old = last.lock().ok().and_then(|mut last| last.replace(value));
    drop(old);
}

/// What the inner `jax.jit` returns: the computation's outputs (`leaves`) with the trace's
/// `JitRecord` (`info`) as static data, a pytree node (registered in `_jit/inner.py`). JAX makes one
/// at every call from the output's treedef, calling the type: a native type builds it with no
/// Python frame.
#[pyclass(frozen, module = "treeclone._native")]
pub struct ResultBox {
    #[pyo3(get)]
    info: Py<PyAny>,
    #[pyo3(get)]
    leaves: Py<PyAny>,
}

#[pymethods]
impl ResultBox {
    #[new]
    fn new(info: Py<PyAny>, leaves: Py<PyAny>) -> Self {
        ResultBox { info, leaves }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.info)?;
        visit.call(&self.leaves)
    }
}
