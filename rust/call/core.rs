//! `JitCore`: the native base class of `treeclone.Jitted`, whose `__call__` it is.
//!
//! A call of a `treeclone.jit` function runs no Python frame of treeclone's on its two fast
//! paths: under `clone` (the check of the arguments for cycles, then `jax.jit`'s own call with
//! the caller's very arguments) and on the lean path of `alias`/`strict` (`LeanCall`). Every
//! other call goes to the Python method `_call_policy`, and a failed check or flatten to the
//! Python methods whose errors name the argument.

use super::{FlattenFailed, LeanCall};
use crate::traverse::plain::{check_arguments, static_positions};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyTuple};
use pyo3::PyTraverseError;
use std::sync::OnceLock;

/// What `Jitted._init_core` hands over once the wrapper is set up.
struct Core {
    /// The wrapper's own policy (a `Policy` or `ArgPolicies`), and the `clone` preset.
    policy: Py<PyAny>,
    clone: Py<PyAny>,
    /// `treeclone.policies.policy_override.get`: a `with treeclone.policy(...)` block's
    /// policy, or None (the bound method, called with no arguments: the cheapest read).
    policy_override: Py<PyAny>,
    /// `jax.jit` of the function, for `clone`; None when `clone` takes the general path
    /// (`traced=`).
    jax_jitted: Option<Py<PyAny>>,
    /// `static_argnums`, as positions, and `static_argnames`.
    static_positions: Vec<isize>,
    static_names: Py<PyFrozenSet>,
    /// Whether calls under the wrapper's own policy (not `clone`) take the lean path.
    lean_allowed: bool,
    /// The lean path's `LeanCall`, made by `_lean_call()` at the first call that takes it.
    lean: OnceLock<Py<LeanCall>>,
}

#[pyclass(frozen, subclass, module = "treeclone")]
pub struct JitCore {
    core: OnceLock<Core>,
}

#[pymethods]
impl JitCore {
    /// Made with any arguments: the subclass's `__init__` takes them.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        JitCore {
            core: OnceLock::new(),
        }
    }

    /// Set what calls need, once per object (`with_policy` makes a new object).
    #[allow(clippy::too_many_arguments)]
    fn _init_core(
        &self,
        policy: Py<PyAny>,
        clone: Py<PyAny>,
        policy_override: Py<PyAny>,
        jax_jitted: Option<Py<PyAny>>,
        static_nums: &Bound<'_, PyFrozenSet>,
        static_names: Py<PyFrozenSet>,
        lean_allowed: bool,
    ) -> PyResult<()> {
        let static_positions = static_positions(static_nums)?;
        let core = Core {
            policy,
            clone,
            policy_override,
            jax_jitted,
            static_positions,
            static_names,
            lean_allowed,
            lean: OnceLock::new(),
        };
        set_up(&self.core, core, "treeclone.jit")
    }

    /// The lean path's `LeanCall` for calls under `policy`, or None when they take the
    /// general path (for `jit_partial`).
    fn _lean_for<'py>(
        slf: &Bound<'py, Self>,
        policy: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, LeanCall>>> {
        let core = core_of(slf)?;
        if !core.takes_lean(policy) {
            return Ok(None);
        }
        lean_of(slf, core).map(Some)
    }

    /// Let go of the leaves the lean path holds from its last call (`Jitted.clear_cache`).
    fn _release_held(&self) {
        if let Some(lean) = self.core.get().and_then(|core| core.lean.get()) {
            lean.get().hold(None);
        }
    }

    /// `fun(*args, **kwargs)`, compiled, under the policy (see `treeclone.jit`).
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let core = core_of(slf)?;
        let policy = core.call_policy(py)?;
        if policy.is(&core.clone) {
            if let Some(jax_jitted) = &core.jax_jitted {
                let (nums, names) = (&core.static_positions, core.static_names.bind(py));
                if let Err(err) = check_arguments(args, kwargs, nums, names) {
                    if err.is_instance_of::<PyValueError>(py) {
                        // The text of every policy, naming the argument.
                        let kwargs = kwargs.cloned().unwrap_or_else(|| PyDict::new(py));
                        slf.call_method1(intern!(py, "_check_cycles"), (args, kwargs))?;
                    }
                    return Err(err);
                }
                let result = jax_jitted.bind(py).call(args, kwargs);
                return result.map_err(|err| explain(slf, err, args, kwargs));
            }
        }
        if core.takes_lean(&policy) {
            let lean = lean_of(slf, core)?;
            match lean.get().call(py, args, kwargs) {
                // The general path's error names the argument.
                Err(err) if err.is_instance_of::<FlattenFailed>(py) => {}
                result => return result.map_err(|err| explain(slf, err, args, kwargs)),
            }
        }
        // A dict of the call's own, as a Python function's `**kwargs` is (`f(**d)` hands the
        // caller's `d` over as it is): it is a node of the arguments' structure.
        let kwargs = match kwargs {
            Some(kwargs) => kwargs.copy()?,
            None => PyDict::new(py),
        };
        slf.call_method1(intern!(py, "_call_policy"), (policy, args, kwargs))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(core) = self.core.get() else {
            return Ok(());
        };
        visit.call(&core.policy)?;
        visit.call(&core.clone)?;
        visit.call(&core.policy_override)?;
        if let Some(jax_jitted) = &core.jax_jitted {
            visit.call(jax_jitted)?;
        }
        visit.call(&core.static_names)?;
        if let Some(lean) = core.lean.get() {
            visit.call(lean)?;
        }
        Ok(())
    }
}

impl Core {
    /// Whether a call under `policy` takes the lean path: the wrapper's own policy, when its
    /// options allow it (`clone`'s own path has returned before).
    fn takes_lean(&self, policy: &Bound<'_, PyAny>) -> bool {
        self.lean_allowed && policy.is(&self.policy)
    }

    /// The policy a call runs under: a `with treeclone.policy(...)` block's, else the
    /// wrapper's own.
    fn call_policy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let given = self.policy_override.bind(py).call0()?;
        Ok(if given.is_none() {
            self.policy.bind(py).clone()
        } else {
            given
        })
    }
}

/// The lean path of a call of `jit` now (under its own policy or a block's), or None when the
/// call takes the general path.
pub(crate) fn lean_now<'py>(jit: &Bound<'py, JitCore>) -> PyResult<Option<Bound<'py, LeanCall>>> {
    let core = core_of(jit)?;
    if !core.takes_lean(&core.call_policy(jit.py())?) {
        return Ok(None);
    }
    lean_of(jit, core).map(Some)
}

/// Fill `cell`, once: the native bases' `_init_*` methods (`what` names the wrapper).
pub(crate) fn set_up<T>(cell: &OnceLock<T>, value: T, what: &str) -> PyResult<()> {
    cell.set(value)
        .map_err(|_| PyTypeError::new_err(format!("{what}: the wrapper is set up already")))
}

fn core_of<'a>(slf: &'a Bound<'_, JitCore>) -> PyResult<&'a Core> {
    slf.get()
        .core
        .get()
        .ok_or_else(|| PyTypeError::new_err("treeclone.jit: the wrapper is not set up"))
}

/// A `TypeError` of a call as the Python method `_explain_type_error` words it (jax.jit's
/// refusal of a leaf that is not an array, with treeclone's remedy); any other error, or one
/// that method cannot word, as it is. Only on the error path.
fn explain(
    slf: &Bound<'_, JitCore>,
    err: PyErr,
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyErr {
    let py = slf.py();
    if !err.is_instance_of::<PyTypeError>(py) {
        return err;
    }
    let kwargs = kwargs.cloned().unwrap_or_else(|| PyDict::new(py));
    let value = err.value(py).clone();
    match slf.call_method1(intern!(py, "_explain_type_error"), (value, args, kwargs)) {
        Ok(explained) => PyErr::from_value(explained),
        Err(_) => err,
    }
}

/// The `LeanCall`, made by the subclass's `_lean_call()` the first time.
fn lean_of<'py>(slf: &Bound<'py, JitCore>, core: &Core) -> PyResult<Bound<'py, LeanCall>> {
    let py = slf.py();
    if let Some(lean) = core.lean.get() {
        return Ok(lean.bind(py).clone());
    }
    let made = slf.call_method0(intern!(py, "_lean_call"))?;
    let made = made.cast_into::<LeanCall>()?;
    // Another thread may have made one meanwhile: either serves.
    let _ = core.lean.set(made.clone().unbind());
    Ok(made)
}
