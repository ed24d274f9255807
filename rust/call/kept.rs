//! `treeclone.jit`'s cache of its leading arguments' flatten (`KeptArguments`, one per
//! wrapper): a training loop passes the same model call after call, and flattening it again at
//! every call is most of a small step's cost (an nnx model: one flatten per Module and per
//! Variable). The cache is `jit_partial`'s own machinery (`BoundArguments`, its `Snapshot` and
//! `bound_join`/`bound_advance`, `bound_args.rs`), in weak mode: it holds no argument.
//!
//! - Which arguments: the leading positional ones that are registered nodes (an nnx or equinox
//!   Module, a dataclass, a registered class; never a leaf, a tuple, list or dict, which no
//!   weak reference can refer to), as far as they are the very objects of the last call (a
//!   model met again, not the new batch after it). Met twice in a row, they are flattened
//!   with their snapshot after the second call (`start`); a later call whose leading
//!   arguments are those objects joins their flatten with its other arguments'
//!   (`call_kept`), as `jit_partial` joins its bound ones, and the flatten is made again only
//!   where their snapshot says they changed. The last call's are remembered by plain weak
//!   references, which keep nothing alive and never match a new object at a dead one's
//!   address.
//! - Memory: the cache refers to the arguments weakly (`BoundArguments(weak=True)`): the
//!   snapshot holds them by weak references, the objects hold None in their places, and a
//!   weak reference's callback (`Forget`) drops the whole record when one of them dies, so a
//!   dropped model's arrays are freed with it. The leaves kept are those the arguments hold
//!   after the last call's write-back. A run that the record would keep alive otherwise (an
//!   argument another refers to), or whose snapshot cannot be checked (CPython's internals
//!   off), is not kept (`usable`).
//! - A call that replaced containers of the kept arguments, or shared an object with them
//!   from its other arguments, ends the record: the next call flattens everything, as
//!   without the cache, and starts it again when it replaces nothing (the former) or never
//!   for those objects (the latter, which would flatten twice at every call).

use super::bound_args::bound_advance;
use super::core::JitCore;
use super::LeanCall;
use crate::registry::{classify, Kind};
use pyo3::exceptions::PyException;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple, PyWeakrefMethods, PyWeakrefReference};
use pyo3::PyTraverseError;
use std::sync::{Arc, Mutex, Weak};

/// The cache of one `treeclone.jit` wrapper (see the module comment).
#[derive(Default)]
pub(crate) struct KeptArguments {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// The record of the kept arguments, if any.
    kept: Option<Kept>,
    /// Numbers the records made, so that a callback drops only its own.
    made: u64,
    /// The last call's leading node arguments (weakly), when it had no record for them: the
    /// ones met again at the next call, in order from the first, are kept.
    last: Vec<Py<PyWeakrefReference>>,
    /// Arguments found not worth keeping (see the module comment), weakly.
    refused: Vec<Py<PyWeakrefReference>>,
}

struct Kept {
    number: u64,
    /// Weak references to the kept arguments (with `Forget` callbacks), in order.
    refs: Vec<Py<PyWeakrefReference>>,
    /// Their `BoundArguments`, in weak mode.
    bound: Py<PyAny>,
}

/// The callback of the kept arguments' weak references: one of them died, so the record of
/// them goes (and with it the leaves it kept).
#[pyclass(frozen, module = "treeclone._native")]
pub struct Forget {
    state: Weak<Mutex<State>>,
    number: u64,
}

#[pymethods]
impl Forget {
    fn __call__(&self, _dead: &Bound<'_, PyAny>) {
        if let Some(state) = self.state.upgrade() {
            let gone = KeptArguments::take_if(&state, |kept| kept.number == self.number);
            drop(gone); // after the lock: its decrefs may run finalizers
        }
    }
}

impl KeptArguments {
    /// The record, taken out where `which` says so; dropped by the caller after the lock.
    fn take_if(state: &Mutex<State>, which: impl Fn(&Kept) -> bool) -> Option<Kept> {
        let mut state = state.lock().ok()?;
        if state.kept.as_ref().is_some_and(which) {
            state.kept.take()
        } else {
            None
        }
    }

    /// Drop the record (`Jitted.clear_cache`).
    pub(crate) fn forget(&self) {
        drop(Self::take_if(&self.state, |_| true));
    }

    /// The record's `BoundArguments`, if there is one.
    pub(crate) fn bound(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        let state = self.state.lock().ok()?;
        state.kept.as_ref().map(|kept| kept.bound.clone_ref(py))
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(state) = self.state.try_lock() {
            if let Some(kept) = state.kept.as_ref() {
                for r in &kept.refs {
                    visit.call(r)?;
                }
                visit.call(&kept.bound)?;
            }
        }
        Ok(())
    }

    /// The record whose arguments lead `args` (by identity), with its number.
    fn kept_for<'py>(&self, args: &Bound<'py, PyTuple>) -> Option<(u64, Bound<'py, PyAny>)> {
        let py = args.py();
        let mut state = self.state.lock().ok()?;
        let kept = state.kept.as_ref()?;
        if kept.refs.len() > args.len() {
            return None;
        }
        for (i, r) in kept.refs.iter().enumerate() {
            // Upgraded and compared without a reference kept: nothing is dropped under the
            // lock (the argument is alive in `args`, so a live referent stays so).
            let same = (r.bind(py).upgrade())
                .is_some_and(|obj| args.get_item(i).is_ok_and(|arg| arg.is(&obj)));
            if !same {
                return None;
            }
        }
        let found = (kept.number, kept.bound.bind(py).clone());
        let last = std::mem::take(&mut state.last);
        drop(state);
        drop(last);
        Some(found)
    }

    /// Note `run` (this call's leading node arguments, no record for them): how many of them,
    /// from the first, are the last call's (0 where those are refused).
    fn again(&self, run: &[Bound<'_, PyAny>]) -> usize {
        let refs = weak_refs(run);
        let Ok(mut state) = self.state.lock() else {
            return 0;
        };
        let same = leading_same(&state.last, run);
        let refused =
            same > 0 && state.refused.len() == same && leading_same(&state.refused, run) == same;
        let last = std::mem::replace(&mut state.last, refs);
        drop(state);
        drop(last);
        if refused {
            0
        } else {
            same
        }
    }

    /// End record `number` after a call of `run` (its kept arguments); `refuse`: do not keep
    /// these arguments again.
    fn end(&self, number: u64, run: &[Bound<'_, PyAny>], refuse: bool) {
        let (refs, refused) = (weak_refs(run), weak_refs(run));
        let gone = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            let refused = refuse.then(|| std::mem::replace(&mut state.refused, refused));
            let last = std::mem::replace(&mut state.last, refs);
            let kept = if state.kept.as_ref().is_some_and(|k| k.number == number) {
                state.kept.take()
            } else {
                None
            };
            (refused, last, kept)
        };
        drop(gone);
    }

    /// Keep the arguments of `run` (this call's leading node arguments, after the call):
    /// their flatten and snapshot, with weak references whose callback drops them. Refused
    /// (not kept again while they are the last call's) where that cannot be done or is not
    /// worth it; an error of the flatten is the next call's to raise.
    fn start<'py>(&self, jit: &Bound<'py, JitCore>, run: &[Bound<'py, PyAny>]) -> PyResult<()> {
        let py = jit.py();
        let number = match self.state.lock() {
            Ok(mut state) => {
                state.made += 1;
                state.made
            }
            Err(_) => return Ok(()),
        };
        let made = (|| -> PyResult<Option<Kept>> {
            let mut refs = Vec::with_capacity(run.len());
            for arg in run {
                let forget = Forget {
                    state: Arc::downgrade(&self.state),
                    number,
                };
                refs.push(PyWeakrefReference::new_with(arg, forget)?.unbind());
            }
            let weak = PyTuple::new(py, refs.iter().map(|r| r.bind(py)))?;
            let bound = jit.call_method1(intern!(py, "_keep_arguments"), (weak,))?;
            if !bound.getattr(intern!(py, "usable"))?.is_truthy()? {
                return Ok(None);
            }
            Ok(Some(Kept {
                number,
                refs,
                bound: bound.unbind(),
            }))
        })();
        let kept = match made {
            Ok(kept) => kept,
            Err(err) if err.is_instance_of::<PyException>(py) => None,
            Err(err) => return Err(err),
        };
        let gone = {
            let Ok(mut state) = self.state.lock() else {
                return Ok(());
            };
            match kept {
                Some(kept) => (state.kept.replace(kept), None),
                None => (
                    None,
                    Some(std::mem::replace(&mut state.refused, weak_refs(run))),
                ),
            }
        };
        drop(gone);
        Ok(())
    }
}

/// Plain weak references to `run`'s objects, as far as they can be made (the one the
/// interpreter keeps for each object: nothing is allocated twice).
fn weak_refs(run: &[Bound<'_, PyAny>]) -> Vec<Py<PyWeakrefReference>> {
    (run.iter())
        .map_while(|obj| PyWeakrefReference::new(obj).ok().map(Bound::unbind))
        .collect()
}

/// How many of `run`'s objects, from the first, `refs` refer to, in order.
fn leading_same(refs: &[Py<PyWeakrefReference>], run: &[Bound<'_, PyAny>]) -> usize {
    (refs.iter().zip(run))
        .take_while(|(r, obj)| r.bind(obj.py()).upgrade().is_some_and(|o| o.is(*obj)))
        .count()
}

/// The leading positional arguments that are registered nodes (see the module comment).
fn leading_nodes<'py>(args: &Bound<'py, PyTuple>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut run = Vec::new();
    for arg in args.iter() {
        if !matches!(classify(&arg)?, Kind::Custom(_)) {
            break;
        }
        run.push(arg);
    }
    Ok(run)
}

/// `fun(*args, **kwargs)` under `lean`'s policy, with the leading arguments' flatten kept
/// between calls where it can be (see the module comment); `FlattenFailed` as `LeanCall::call_with`.
pub(crate) fn call<'py>(
    jit: &Bound<'py, JitCore>,
    kept: &KeptArguments,
    lean: &Bound<'py, LeanCall>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = jit.py();
    let call = lean.get();
    let keywords = kwargs.is_some_and(|k| !k.is_empty());
    if call.splits_statics() || (call.takes_no_keywords() && keywords) {
        // Static arguments are taken out first.
        return call
            .call_with(py, args, kwargs, None, None)
            .map(|(out, _)| out);
    }
    if let Some((number, bound)) = kept.kept_for(args) {
        return call_kept(kept, number, &bound, lean, args, kwargs);
    }
    let run = leading_nodes(args)?;
    let (out, info) = call.call_with(py, args, kwargs, None, None)?;
    if run.is_empty() {
        return Ok(out);
    }
    let same = kept.again(&run);
    if same > 0 {
        let next_inputs = info.getattr(intern!(py, "next_inputs"))?;
        if !next_inputs.is(PyBool::new(py, false)) {
            kept.start(jit, &run[..same])?; // after the call: what the arguments hold now
        }
    }
    Ok(out)
}

/// A call with record `number` of its leading arguments (`bound`): the native call joining
/// their flatten with the others' (`LeanCall::call_joining`), then the write-back followed
/// into the record (`bound_advance`), as a `jit_partial` call does, unless the record ends.
fn call_kept<'py>(
    kept: &KeptArguments,
    number: u64,
    bound: &Bound<'py, PyAny>,
    lean: &Bound<'py, LeanCall>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = args.py();
    let run = || -> Vec<Bound<'py, PyAny>> {
        let n = bound
            .getattr(intern!(py, "args"))
            .map_or(0, |a| a.len().unwrap_or(0));
        args.iter().take(n).collect()
    };
    let (out, info, outputs, leaves) =
        match (lean.get()).call_joining(py, args, kwargs, Some(bound), None) {
            Ok(called) => called,
            Err(err) => {
                kept.end(number, &run(), false); // the next call flattens, and starts again
                return Err(err);
            }
        };
    if bound.getattr(intern!(py, "stale"))?.is_truthy()? {
        // The call's other arguments share objects with the kept ones (`bound_join`):
        // kept, each call would flatten them twice.
        kept.end(number, &run(), true);
        return Ok(out);
    }
    let next_inputs = info.getattr(intern!(py, "next_inputs"))?;
    bound_advance(bound, &next_inputs, &leaves, &outputs)?;
    if bound.getattr(intern!(py, "replaced"))?.is_truthy()? {
        kept.end(number, &run(), false); // the next call flattens everything, and starts again
    } else if !bound.getattr(intern!(py, "usable"))?.is_truthy()? {
        kept.end(number, &run(), true); // flattened again during the call, and not keepable
    }
    Ok(out)
}
