//! `treeclone.jit`'s cache of its leading arguments' flatten (`KeptArguments`, one per
//! wrapper): a training loop passes the same model call after call, and flattening it again at
//! every call is most of a small step's cost (an nnx model: one flatten per Module and per
//! Variable). The cache is `jit_partial`'s own machinery (`BoundArguments`, its `Snapshot` and
//! `bound_join`/`bound_advance`, `bound_args.rs`), in weak mode: it holds no argument.
//!
//! - Which arguments: the leading positional ones that are registered nodes (an nnx or equinox
//!   Module, a dataclass, a registered class; never a leaf, a tuple, list or dict, which no
//!   weak reference can refer to) when they are the very objects of the last call. Such a run
//!   met twice in a row is flattened with its snapshot after the second call (`start`); a
//!   later call whose leading arguments are those objects joins their flatten with its own
//!   arguments' (`call_kept`), as `jit_partial` joins its bound ones, and the flatten is made
//!   again only where their snapshot says they changed.
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

use super::bound_args::{bound_advance, bound_join};
use super::core::JitCore;
use super::statics::{keyword_items, sorted_dict};
use super::{FlattenFailed, LeanCall};
use crate::registry::{classify, Kind};
use pyo3::exceptions::{PyException, PyValueError};
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
    /// The addresses of the last call's leading node arguments, when it had no record for
    /// them: met twice in a row, they are kept. An address reused by another object costs
    /// at most a record made for nothing.
    last: Vec<usize>,
    /// The addresses of a run found not worth keeping (see the module comment).
    refused: Vec<usize>,
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
        state.last.clear();
        Some(found)
    }

    /// Note `run` (the addresses of this call's leading node arguments, no record for them):
    /// whether it is the last call's (and not refused).
    fn again(&self, run: Vec<usize>) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        let again = state.last == run && state.refused != run;
        state.last = run;
        again
    }

    /// End record `number` after a call; `refuse`: do not keep these arguments again.
    fn end(&self, number: u64, run: Vec<usize>, refuse: bool) {
        let gone = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            if refuse {
                state.refused = run.clone();
            }
            state.last = run;
            if state.kept.as_ref().is_some_and(|k| k.number == number) {
                state.kept.take()
            } else {
                None
            }
        };
        drop(gone);
    }

    /// Keep the arguments of `run` (this call's leading node arguments, after the call):
    /// their flatten and snapshot, with weak references whose callback drops them. Refused
    /// (not kept again while they are the last call's) where that cannot be done or is not
    /// worth it; an error of the flatten is the next call's to raise.
    fn start<'py>(&self, jit: &Bound<'py, JitCore>, run: &[Bound<'py, PyAny>]) -> PyResult<()> {
        let py = jit.py();
        let addresses: Vec<usize> = run.iter().map(|a| a.as_ptr() as usize).collect();
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
                Some(kept) => state.kept.replace(kept),
                None => {
                    state.refused = addresses;
                    None
                }
            }
        };
        drop(gone);
        Ok(())
    }
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
/// between calls where it can be (see the module comment); `FlattenFailed` as `LeanCall::call`.
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
        return call.call(py, args, kwargs); // static arguments are taken out first
    }
    if let Some((number, bound)) = kept.kept_for(args) {
        return call_kept(kept, number, &bound, lean, args, kwargs);
    }
    let run = leading_nodes(args)?;
    if run.is_empty() {
        return call.call(py, args, kwargs);
    }
    let (out, info, _) = call.call_traced(py, args, kwargs)?;
    let addresses = run.iter().map(|a| a.as_ptr() as usize).collect();
    if kept.again(addresses) {
        let next_inputs = info.getattr(intern!(py, "next_inputs"))?;
        if !next_inputs.is(PyBool::new(py, false)) {
            kept.start(jit, &run)?; // after the call: what the arguments hold now
        }
    }
    Ok(out)
}

/// A call with record `number` of its leading arguments (`bound`): joined with the others'
/// flatten (`bound_join`), the native call, and the write-back followed into the record
/// (`bound_advance`), as a `jit_partial` call does.
fn call_kept<'py>(
    kept: &KeptArguments,
    number: u64,
    bound: &Bound<'py, PyAny>,
    lean: &Bound<'py, LeanCall>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = args.py();
    let items = match kwargs {
        Some(kwargs) => keyword_items(kwargs)?,
        None => Vec::new(),
    };
    let kwargs = sorted_dict(py, items)?;
    let run = || -> Vec<usize> {
        let n = bound
            .getattr(intern!(py, "args"))
            .map_or(0, |a| a.len().unwrap_or(0));
        (args.iter().take(n)).map(|a| a.as_ptr() as usize).collect()
    };
    let (leaves, sdef, objects) = match bound_join(bound, args, &kwargs) {
        Ok(joined) => joined,
        Err(err) => {
            kept.end(number, run(), false);
            if err.is_instance_of::<PyValueError>(py) {
                // A cycle: the general path's error names the argument.
                return Err(FlattenFailed::new_err(()));
            }
            return Err(err);
        }
    };
    let (out, info, outputs) =
        (lean.get()).call_joined(py, args, &kwargs, leaves.clone(), sdef, objects)?;
    if bound.getattr(intern!(py, "stale"))?.is_truthy()? {
        // The call's other arguments share objects with the kept ones (`bound_join`):
        // kept, each call would flatten them twice.
        kept.end(number, run(), true);
        return Ok(out);
    }
    let next_inputs = info.getattr(intern!(py, "next_inputs"))?;
    bound_advance(bound, &next_inputs, &leaves, &outputs)?;
    if bound.getattr(intern!(py, "replaced"))?.is_truthy()? {
        kept.end(number, run(), false); // the next call flattens everything, and starts again
    } else if !bound.getattr(intern!(py, "usable"))?.is_truthy()? {
        kept.end(number, run(), true); // flattened again during the call, and not keepable
    }
    Ok(out)
}
