//! `JitCore`: the native base class of `treeclone.Jitted`, whose `__call__` it is.
//!
//! A call of a `treeclone.jit` function runs no Python frame of treeclone's once cached: under
//! `clone` (without `traced=`) the check of the arguments for cycles, then `jax.jit`'s own call
//! with the caller's very arguments; under any other policy (or with `traced=`) the native call
//! of that policy (`LeanCall`, one per policy met: the wrapper's own, or a `with
//! treeclone.policy(...)` block's). A failed check or flatten goes to the Python methods whose
//! errors name the argument.

use super::kept::{self, KeptArguments};
use super::{FlattenFailed, LeanCall};
use crate::traverse::plain::{check_arguments, static_positions};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyTuple};
use pyo3::PyTraverseError;
use std::sync::{Mutex, OnceLock};

/// What `Jitted._init_core` hands over once the wrapper is set up.
struct Core {
    /// The wrapper's own policy (a `Policy` or `ArgPolicies`), and the `clone` preset.
    policy: Py<PyAny>,
    clone: Py<PyAny>,
    /// `treeclone.policies.policy_override.get`: a `with treeclone.policy(...)` block's
    /// policy, or None (the bound method, called with no arguments: the cheapest read).
    policy_override: Py<PyAny>,
    /// `jax.jit` of the function, for `clone`; None when `clone` takes the native call too
    /// (`traced=`).
    jax_jitted: Option<Py<PyAny>>,
    /// `static_argnums`, as positions, and `static_argnames`.
    static_positions: Vec<isize>,
    static_names: Py<PyFrozenSet>,
    /// The native call of each policy met (the policy object, compared by identity), made by
    /// `_lean_call(policy)` at the first call under it.
    lean: Mutex<Vec<(Py<PyAny>, Py<LeanCall>)>>,
    /// The flatten of the leading arguments, kept between calls while they are the same
    /// objects (`kept.rs`).
    kept: KeptArguments,
}

/// How many policies' native calls a wrapper keeps (a block's `ArgPolicies` made anew at each
/// call is not kept past them).
const POLICIES_KEPT: usize = 8;

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
    ) -> PyResult<()> {
        let static_positions = static_positions(static_nums)?;
        let core = Core {
            policy,
            clone,
            policy_override,
            jax_jitted,
            static_positions,
            static_names,
            lean: Mutex::new(Vec::new()),
            kept: KeptArguments::default(),
        };
        set_up(&self.core, core, "treeclone.jit")
    }

    /// The native call of calls under `policy` (for `jit_partial`).
    fn _lean_for<'py>(
        slf: &Bound<'py, Self>,
        policy: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, LeanCall>> {
        lean_of(slf, core_of(slf)?, policy)
    }

    /// Let go of the leaves the native calls hold from their last calls, and of the kept
    /// flatten of the arguments (`Jitted.clear_cache`).
    fn _release_held(&self, py: Python<'_>) {
        let Some(core) = self.core.get() else {
            return;
        };
        core.kept.forget();
        let calls: Vec<Py<LeanCall>> = match core.lean.lock() {
            Ok(lean) => lean.iter().map(|(_, call)| call.clone_ref(py)).collect(),
            Err(_) => return,
        };
        for call in calls {
            call.get().hold(None);
        }
    }

    /// The `BoundArguments` (weak mode) of the leading arguments kept between calls, or None
    /// (`kept.rs`; for tests and benches).
    fn _kept(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.core.get().and_then(|core| core.kept.bound(py))
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
                return result.map_err(|err| worded(slf, err, args, kwargs));
            }
        }
        let lean = lean_of(slf, core, &policy)?;
        kept::call(slf, &core.kept, &lean, args, kwargs)
            .map_err(|err| worded(slf, err, args, kwargs))
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
        if let Ok(lean) = core.lean.try_lock() {
            for (policy, call) in lean.iter() {
                visit.call(policy)?;
                visit.call(call)?;
            }
        }
        core.kept.traverse(&visit)
    }
}

impl Core {
    /// Whether a call under `policy` is `jax.jit`'s own (`clone` without `traced=`).
    fn is_jax_call(&self, policy: &Bound<'_, PyAny>) -> bool {
        self.jax_jitted.is_some() && policy.is(&self.clone)
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

/// The policy of a call of `jit` now (its own or a block's), with its native call, or None
/// when the call is `jax.jit`'s own.
#[allow(clippy::type_complexity)]
pub(crate) fn lean_now<'py>(
    jit: &Bound<'py, JitCore>,
) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, LeanCall>>)> {
    let core = core_of(jit)?;
    let policy = core.call_policy(jit.py())?;
    if core.is_jax_call(&policy) {
        return Ok((policy, None));
    }
    let lean = lean_of(jit, core, &policy)?;
    Ok((policy, Some(lean)))
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

/// A call's error as the user reads it, worded by Python (only on the error path): arguments
/// the native call could not flatten (`FlattenFailed`) by `_refuse`, which names the
/// argument; a `TypeError` by `_explain_type_error` (jax.jit's refusal of a leaf that is not
/// an array, with treeclone's remedy, or the error as it is); any other as it is.
pub(crate) fn worded(
    slf: &Bound<'_, JitCore>,
    err: PyErr,
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyErr {
    let py = slf.py();
    let refused = err.is_instance_of::<FlattenFailed>(py);
    if !refused && !err.is_instance_of::<PyTypeError>(py) {
        return err;
    }
    let kwargs = kwargs.cloned().unwrap_or_else(|| PyDict::new(py));
    let value = err.value(py).clone();
    let method = if refused {
        intern!(py, "_refuse")
    } else {
        intern!(py, "_explain_type_error")
    };
    match (refused, slf.call_method1(method, (value, args, kwargs))) {
        (true, Err(raised)) => raised, // `_refuse` raises the error it words
        (false, Ok(explained)) => PyErr::from_value(explained),
        _ => err, // (`_explain_type_error` failing: the error as it is)
    }
}

/// The native call of `policy`, made by the subclass's `_lean_call(policy)` the first time.
fn lean_of<'py>(
    slf: &Bound<'py, JitCore>,
    core: &Core,
    policy: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, LeanCall>> {
    let py = slf.py();
    if let Ok(lean) = core.lean.lock() {
        if let Some((_, call)) = lean.iter().find(|(p, _)| p.is(policy)) {
            return Ok(call.bind(py).clone());
        }
    }
    // Python code runs here: nothing is held locked meanwhile. Another thread may make one
    // too: either serves.
    let made = slf.call_method1(intern!(py, "_lean_call"), (policy,))?;
    let made = made.cast_into::<LeanCall>()?;
    if let Ok(mut lean) = core.lean.lock() {
        if lean.len() < POLICIES_KEPT {
            lean.push((policy.clone().unbind(), made.clone().unbind()));
        }
    }
    Ok(made)
}
