//! `StageCall`: calling a traced or compiled stage of `treeclone.jit` or `jit_partial`
//! (`jitted.trace(...)`, `.lower(...).compile()`), natively. It is the jitted call with the
//! stage in place of the inner jit (`LeanCall::call_with`): the same flatten, key, write-back
//! and `jit_partial` cache, for calls of the key the stage was made for, under the policy it
//! was made under, with its static arguments put back where the call leaves them out (as
//! jax.jit's stages take the dynamic arguments only). Anything else (another policy, a static
//! argument given, arguments of another key or that cannot be flattened) goes to `refuse`, the
//! Python function that says what differs; nothing has run then.

use super::lean::StageTarget;
use super::{FlattenFailed, LeanCall};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::PyTraverseError;

/// `jit_partial`'s part of a stage: its bound arguments and their `BoundArguments`, and the
/// `JitPartial`, told after each call whether it replaced bound containers.
struct BoundPart {
    args: Py<PyTuple>,
    arguments: Py<PyAny>,
    partial: Py<PyAny>,
}

#[pyclass(frozen, module = "treeclone._native")]
pub struct StageCall {
    /// The native call of the policy the stage was made under.
    lean: Py<LeanCall>,
    /// The jax stage (`jax.stages.Traced` or `Compiled` of the inner jit), its key, and
    /// whether that key holds the arguments' placements.
    stage: Py<PyAny>,
    key: Py<PyAny>,
    keyed: bool,
    /// The policy the stage was made under, the wrapper's own, and
    /// `policy_override.get` (a `with treeclone.policy(...)` block's, or None).
    policy: Py<PyAny>,
    own_policy: Py<PyAny>,
    policy_override: Py<PyAny>,
    /// The static arguments fixed when the stage was made: `(position, value)` in order, and
    /// by keyword.
    fixed: Vec<(usize, Py<PyAny>)>,
    fixed_names: Py<PyDict>,
    bound: Option<BoundPart>,
    /// `refuse(args, kwargs)`: raises the error of a call this does not take.
    refuse: Py<PyAny>,
}

#[pymethods]
impl StageCall {
    #[new]
    #[pyo3(signature = (
        lean, stage, key, keyed, policy, own_policy, policy_override, fixed, fixed_names,
        refuse, bound=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        lean: Py<LeanCall>,
        stage: Py<PyAny>,
        key: Py<PyAny>,
        keyed: bool,
        policy: Py<PyAny>,
        own_policy: Py<PyAny>,
        policy_override: Py<PyAny>,
        fixed: Vec<(usize, Py<PyAny>)>,
        fixed_names: Py<PyDict>,
        refuse: Py<PyAny>,
        bound: Option<(Py<PyTuple>, Py<PyAny>, Py<PyAny>)>,
    ) -> Self {
        StageCall {
            lean,
            stage,
            key,
            keyed,
            policy,
            own_policy,
            policy_override,
            fixed,
            fixed_names,
            bound: bound.map(|(args, arguments, partial)| BoundPart {
                args,
                arguments,
                partial,
            }),
            refuse,
        }
    }

    /// The jitted call of `(*bound, *args)` and `kwargs`, the static arguments put back,
    /// computed by the stage.
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let refuse = || self.refuse.bind(py).call((args, kwargs), None);
        if !self.policy_holds(py)? || self.names_a_static(py, kwargs)? {
            return refuse();
        }
        let all = self.with_statics(py, args)?;
        let kwargs = self.with_static_names(py, kwargs)?;
        let target = StageTarget {
            stage: self.stage.bind(py).clone(),
            key: self.key.bind(py).clone(),
            keyed: self.keyed,
        };
        let arguments = self.bound.as_ref().map(|b| b.arguments.bind(py));
        let lean = self.lean.get();
        let result = lean.call_with(py, &all, Some(&kwargs), arguments, Some(&target));
        if let Some(bound) = &self.bound {
            let replaced = bound.arguments.bind(py).getattr(intern!(py, "replaced"))?;
            (bound.partial.bind(py)).call_method1(intern!(py, "_set_replaced"), (replaced,))?;
        }
        match result {
            Err(err) if err.is_instance_of::<FlattenFailed>(py) => refuse(),
            result => result.map(|(out, _)| out),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.lean)?;
        visit.call(&self.stage)?;
        visit.call(&self.key)?;
        visit.call(&self.policy)?;
        visit.call(&self.own_policy)?;
        visit.call(&self.policy_override)?;
        for (_, value) in &self.fixed {
            visit.call(value)?;
        }
        visit.call(&self.fixed_names)?;
        if let Some(bound) = &self.bound {
            visit.call(&bound.args)?;
            visit.call(&bound.arguments)?;
            visit.call(&bound.partial)?;
        }
        visit.call(&self.refuse)
    }
}

impl StageCall {
    /// Whether the call runs under the policy the stage was made under (a block's, else the
    /// wrapper's own): what a call writes back is part of the stage's compiled code.
    fn policy_holds(&self, py: Python<'_>) -> PyResult<bool> {
        let given = self.policy_override.bind(py).call0()?;
        let now = if given.is_none() {
            self.own_policy.bind(py).clone()
        } else {
            given
        };
        Ok(now.is(&self.policy) || now.eq(&self.policy)?)
    }

    /// Whether `kwargs` gives a static argument the stage has fixed.
    fn names_a_static(&self, py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<bool> {
        let Some(kwargs) = kwargs else {
            return Ok(false);
        };
        for name in self.fixed_names.bind(py).keys() {
            if kwargs.contains(name)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `(*bound, *args)` with the fixed static values at their positions (fewer arguments
    /// than the stage was made for: a key that differs, said by `refuse`).
    fn with_statics<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let bound = self.bound.as_ref().map(|b| b.args.bind(py).clone());
        let mut given = bound.iter().flat_map(|b| b.iter()).chain(args.iter());
        let mut fixed = self.fixed.iter().peekable();
        let mut all = Vec::with_capacity(args.len() + self.fixed.len());
        loop {
            if let Some((_, value)) = fixed.next_if(|(at, _)| *at == all.len()) {
                all.push(value.bind(py).clone());
            } else if let Some(arg) = given.next() {
                all.push(arg);
            } else {
                break;
            }
        }
        PyTuple::new(py, all)
    }

    /// The call's keywords with the fixed static ones added, in a dict of the call's own.
    fn with_static_names<'py>(
        &self,
        py: Python<'py>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let all = match kwargs {
            Some(kwargs) => kwargs.copy()?,
            None => PyDict::new(py),
        };
        all.update(self.fixed_names.bind(py).as_mapping())?;
        Ok(all)
    }
}
