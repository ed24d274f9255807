//! `PartialCore`: the native base of `treeclone.JitPartial`, whose `__call__` it is.
//!
//! A `jit_partial` whose function replaces containers of the bound arguments at every call
//! (`state["params"] = optax.apply_updates(...)`, as an optax step does) keeps no cache of
//! them: each call flattens everything together, as `jit` does (`_jit/partial.py`). Such a call
//! takes `jit`'s own lean path here, the bound arguments put before the others, with no
//! Python frame of treeclone's, so that it costs what the same call of `jit` costs. Every
//! other call runs the Python method `_call_bound`, which keeps the cache.

use super::core::{lean_now, set_up, JitCore};
use super::FlattenFailed;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};
use pyo3::PyTraverseError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What `JitPartial._init_partial` hands over once the wrapper is set up.
struct Setup {
    /// The `treeclone.Jitted` of the function.
    jitted: Py<JitCore>,
    /// The bound arguments, first of every call's.
    bound: Py<PyTuple>,
    /// Whether calls may take the native call with everything flattened together (no static
    /// arguments).
    lean_allowed: bool,
}

#[pyclass(frozen, subclass, module = "treeclone")]
pub struct PartialCore {
    setup: OnceLock<Setup>,
    /// The last call replaced containers of the bound arguments (`BoundArguments.replaced`,
    /// mirrored by `_set_replaced`): the next flattens everything, on the lean path.
    replaced: AtomicBool,
}

#[pymethods]
impl PartialCore {
    /// Made with any arguments: the subclass's `__init__` takes them.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        PartialCore {
            setup: OnceLock::new(),
            replaced: AtomicBool::new(false),
        }
    }

    /// Set what calls need, once per object.
    fn _init_partial(
        &self,
        jitted: Py<JitCore>,
        bound: Py<PyTuple>,
        lean_allowed: bool,
    ) -> PyResult<()> {
        let setup = Setup {
            jitted,
            bound,
            lean_allowed,
        };
        set_up(&self.setup, setup, "treeclone.jit_partial")
    }

    fn _set_replaced(&self, replaced: bool) {
        self.replaced.store(replaced, Ordering::Relaxed);
    }

    /// `fun(*bound, *args, **kwargs)`, compiled, under the policy (see
    /// `treeclone.jit_partial`).
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        if let Some(setup) = slf.get().setup.get() {
            if setup.lean_allowed && slf.get().replaced.load(Ordering::Relaxed) {
                if let Some(lean) = lean_now(setup.jitted.bind(py))? {
                    let all: Vec<_> = setup.bound.bind(py).iter().chain(args.iter()).collect();
                    let all = PyTuple::new(py, all)?;
                    match lean.get().call_traced(py, &all, kwargs) {
                        // The Python path's error names the argument.
                        Err(err) if err.is_instance_of::<FlattenFailed>(py) => {}
                        Err(err) => return Err(err),
                        Ok((out, info, _)) => {
                            let next = info.getattr(intern!(py, "next_inputs"))?;
                            if !next.is(PyBool::new(py, false)) {
                                // Nothing replaced this time: the cache starts again.
                                slf.call_method0(intern!(py, "_resume"))?;
                            }
                            return Ok(out);
                        }
                    }
                }
            }
        }
        slf.call_method(intern!(py, "_call_bound"), args, kwargs)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(setup) = self.setup.get() {
            visit.call(&setup.jitted)?;
            visit.call(&setup.bound)?;
        }
        Ok(())
    }
}
