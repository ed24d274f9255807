//! `PartialCore`: the native base of `treeclone.JitPartial`, whose `__call__` it is.
//!
//! A `jit_partial` whose function replaces containers of the bound arguments at every call
//! (`state["params"] = optax.apply_updates(...)`, as an optax step does) keeps no cache of
//! them: each call flattens everything together, as `jit` does (`_jit/partial.py`). Such a call
//! takes `jit`'s own lean path here, the bound arguments put before the others, with no
//! Python frame of treeclone's, so that it costs what the same call of `jit` costs. Every
//! other call keeps the cache of the bound arguments (`bound_args.rs`), natively too; the
//! Python method `_call_bound` checks a policy not seen yet, then calls `_call_checked`.

use super::core::{lean_now, set_up, worded, JitCore};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};
use pyo3::PyTraverseError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// What `JitPartial._init_partial` hands over once the wrapper is set up.
struct Setup {
    /// The `treeclone.Jitted` of the function.
    jitted: Py<JitCore>,
    /// The bound arguments, first of every call's.
    bound: Py<PyTuple>,
    /// Their `BoundArguments`: the flatten, the snapshot and the caches calls use.
    arguments: Py<PyAny>,
}

#[pyclass(frozen, subclass, module = "treeclone")]
pub struct PartialCore {
    setup: OnceLock<Setup>,
    /// The last call replaced containers of the bound arguments (`BoundArguments.replaced`,
    /// mirrored by `_set_replaced`): the next flattens everything, on the lean path.
    replaced: AtomicBool,
    /// The policies calls were checked to run under (they preserve identity), by identity: a
    /// call under another goes to `_call_bound`, whose check words the error.
    checked: Mutex<Vec<Py<PyAny>>>,
}

/// How many policies' checks a wrapper keeps (as `core.rs` keeps their native calls).
const POLICIES_KEPT: usize = 8;

#[pymethods]
impl PartialCore {
    /// Made with any arguments: the subclass's `__init__` takes them.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        PartialCore {
            setup: OnceLock::new(),
            replaced: AtomicBool::new(false),
            checked: Mutex::new(Vec::new()),
        }
    }

    /// Set what calls need, once per object.
    fn _init_partial(
        &self,
        jitted: Py<JitCore>,
        bound: Py<PyTuple>,
        arguments: Py<PyAny>,
    ) -> PyResult<()> {
        let setup = Setup {
            jitted,
            bound,
            arguments,
        };
        set_up(&self.setup, setup, "treeclone.jit_partial")
    }

    fn _set_replaced(&self, replaced: bool) {
        self.replaced.store(replaced, Ordering::Relaxed);
    }

    /// Note that calls under `policy` passed `_call_bound`'s check of it.
    fn _checked(&self, policy: &Bound<'_, PyAny>) {
        if let Ok(mut checked) = self.checked.lock() {
            if checked.len() < POLICIES_KEPT && !checked.iter().any(|p| p.is(policy)) {
                checked.push(policy.clone().unbind());
            }
        }
    }

    /// `fun(*bound, *args, **kwargs)`, compiled, under the policy (see
    /// `treeclone.jit_partial`).
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(setup) = slf.get().setup.get() {
            if let Some(out) = call_native(slf, setup, args, kwargs)? {
                return Ok(out);
            }
        }
        slf.call_method(intern!(slf.py(), "_call_bound"), args, kwargs)
    }

    /// A call under the policy `_call_bound` has just checked: the native call with the
    /// bound arguments' cache.
    fn _call_checked<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let setup = (slf.get().setup.get())
            .ok_or_else(|| PyTypeError::new_err("treeclone.jit_partial: not set up"))?;
        call_cached(slf, setup, args, Some(kwargs), false)?.ok_or_else(|| {
            PyValueError::new_err("treeclone.jit_partial: this policy has no native call")
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(setup) = self.setup.get() {
            visit.call(&setup.jitted)?;
            visit.call(&setup.bound)?;
            visit.call(&setup.arguments)?;
        }
        if let Ok(checked) = self.checked.try_lock() {
            for policy in checked.iter() {
                visit.call(policy)?;
            }
        }
        Ok(())
    }
}

/// The call, natively: everything flattened together while the bound containers are
/// replaced at every call (nothing cached then), else with the bound arguments' cache
/// (`call_cached`). None when the call goes to `_call_bound` instead (nothing has run then).
fn call_native<'py>(
    slf: &Bound<'py, PartialCore>,
    setup: &Setup,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !slf.get().replaced.load(Ordering::Relaxed) {
        return call_cached(slf, setup, args, kwargs, true);
    }
    let py = slf.py();
    let jitted = setup.jitted.bind(py);
    let (_, Some(lean)) = lean_now(jitted)? else {
        return Ok(None);
    };
    let all: Vec<_> = setup.bound.bind(py).iter().chain(args.iter()).collect();
    let all = PyTuple::new(py, all)?;
    let (out, info) = (lean.get().call_with(py, &all, kwargs, None, None))
        .map_err(|err| worded(jitted, err, &all, kwargs))?;
    let next = info.getattr(intern!(py, "next_inputs"))?;
    if !next.is(PyBool::new(py, false)) {
        // Nothing replaced this time: the cache starts again.
        slf.call_method0(intern!(py, "_resume"))?;
    }
    Ok(Some(out))
}

/// A call with the cache of the bound arguments, natively: the policy's native call with the
/// bound arguments joined with the call's own and followed through its write-back
/// (`LeanCall::call_with`), its errors worded (`worded`). None when the call goes to
/// `_call_bound` instead (nothing has run then): `clone`, or (`checked_only`) a policy not
/// checked yet.
fn call_cached<'py>(
    slf: &Bound<'py, PartialCore>,
    setup: &Setup,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    checked_only: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = slf.py();
    let jitted = setup.jitted.bind(py);
    let (policy, Some(lean)) = lean_now(jitted)? else {
        return Ok(None);
    };
    let checked = || (slf.get().checked.lock()).is_ok_and(|c| c.iter().any(|p| p.is(&policy)));
    if checked_only && !checked() {
        return Ok(None);
    }
    let all: Vec<Bound<'py, PyAny>> = setup.bound.bind(py).iter().chain(args.iter()).collect();
    let all = PyTuple::new(py, all)?;
    let arguments = setup.arguments.bind(py);
    let result = lean
        .get()
        .call_with(py, &all, kwargs, Some(arguments), None);
    let replaced = arguments.getattr(intern!(py, "replaced"))?.is_truthy()?;
    slf.get().replaced.store(replaced, Ordering::Relaxed);
    match result {
        Ok((out, _)) => Ok(Some(out)),
        Err(err) => Err(worded(jitted, err, &all, kwargs)),
    }
}
