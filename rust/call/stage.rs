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

/// The policy a stage was made under, the wrapper's own, and `policy_override.get` (a `with
/// treeclone.policy(...)` block's, or None).
struct Policies {
    made_under: Py<PyAny>,
    own: Py<PyAny>,
    block: Py<PyAny>,
}

/// The static arguments fixed when the stage was made: `(position, value)` in order, and by
/// keyword.
struct Fixed {
    at: Vec<(usize, Py<PyAny>)>,
    named: Py<PyDict>,
}

#[pyclass(frozen, module = "treeclone._native")]
pub struct StageCall {
    /// The native call of the policy the stage was made under.
    lean: Py<LeanCall>,
    /// The jax stage (`jax.stages.Traced` or `Compiled` of the inner jit), the key it was
    /// made for, and whether that key holds the arguments' placements.
    made: (Py<PyAny>, Py<PyAny>, bool),
    policies: Policies,
    fixed: Fixed,
    bound: Option<BoundPart>,
    /// `refuse(args, kwargs)`: raises the error of a call this does not take.
    refuse: Py<PyAny>,
}

#[pymethods]
impl StageCall {
    /// `made`: `(stage, key, keyed)`; `policies`: `(made under, the wrapper's own,
    /// policy_override.get)`; `fixed`: the static values by position and by keyword;
    /// `bound`: `jit_partial`'s `(bound arguments, BoundArguments, JitPartial)`.
    #[new]
    #[pyo3(signature = (lean, made, policies, fixed, refuse, bound=None))]
    fn new(
        lean: Py<LeanCall>,
        made: (Py<PyAny>, Py<PyAny>, bool),
        policies: (Py<PyAny>, Py<PyAny>, Py<PyAny>),
        fixed: (Vec<(usize, Py<PyAny>)>, Py<PyDict>),
        refuse: Py<PyAny>,
        bound: Option<(Py<PyTuple>, Py<PyAny>, Py<PyAny>)>,
    ) -> Self {
        let (made_under, own, block) = policies;
        let bound = bound.map(|(args, arguments, partial)| BoundPart {
            args,
            arguments,
            partial,
        });
        StageCall {
            lean,
            made,
            policies: Policies {
                made_under,
                own,
                block,
            },
            fixed: Fixed {
                at: fixed.0,
                named: fixed.1,
            },
            bound,
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
        let (stage, key, keyed) = &self.made;
        let target = StageTarget {
            stage: stage.bind(py).clone(),
            key: key.bind(py).clone(),
            keyed: *keyed,
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
        visit.call(&self.made.0)?;
        visit.call(&self.made.1)?;
        visit.call(&self.policies.made_under)?;
        visit.call(&self.policies.own)?;
        visit.call(&self.policies.block)?;
        for (_, value) in &self.fixed.at {
            visit.call(value)?;
        }
        visit.call(&self.fixed.named)?;
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
        let policies = &self.policies;
        let given = policies.block.bind(py).call0()?;
        let now = if given.is_none() {
            policies.own.bind(py).clone()
        } else {
            given
        };
        Ok(now.is(&policies.made_under) || now.eq(&policies.made_under)?)
    }

    /// Whether `kwargs` gives a static argument the stage has fixed.
    fn names_a_static(&self, py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<bool> {
        let Some(kwargs) = kwargs else {
            return Ok(false);
        };
        for name in self.fixed.named.bind(py).keys() {
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
        let mut fixed = self.fixed.at.iter().peekable();
        let mut all = Vec::with_capacity(args.len() + self.fixed.at.len());
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
        all.update(self.fixed.named.bind(py).as_mapping())?;
        Ok(all)
    }
}
