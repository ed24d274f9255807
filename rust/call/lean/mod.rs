//! `LeanCall`: one call of `treeclone.jit` under a policy other than `clone` (or with
//! `traced=`), in one native call: every configuration (static arguments, donation, `traced=`
//! static leaves, `in_shardings`, arguments on a mesh), for `jit` and `jit_partial` alike.
//!
//! It takes the static arguments out (with the function's `StaticArguments`, the `CallShape`'s),
//! flattens the others with identity (`flatten_shared`), sorts out the leaves `traced=` leaves
//! static, finds the key of the call (one key object per structure, static values, static
//! leaves and placements, kept by the inner function, so that JAX compares it by identity) with
//! the order the inner jit takes the leaves in (the kept ones, the donated ones), runs the inner
//! `jax.jit` as `jitted(key, donated, *kept)` with the call recorded for its debug info, and
//! applies the trace's `CallPlan`. Python runs on a cache miss (`key_of`: the key of a new
//! structure, its donation and static leaves), at a trace, and on the error paths: an argument
//! that cannot be flattened (`FlattenFailed`: Python's `_refuse` names it), and
//! `finish`, for a result that hands inputs back as `jax.jit`'s arrays (strict) or a write-back
//! inside a JAX transformation.

mod key;

use super::bound_args::{bound_advance, bound_join};
use super::statics::{keyword_items, sorted_dict, StaticArguments};
use super::{replace_last, running, FlattenFailed, ResultBox, ShardedArguments};
use crate::sharing::{flatten_shared_sized, Sizes};
use crate::writeback::CallPlan;
use key::{Keys, LeanKey};
use pyo3::exceptions::PyValueError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use pyo3::PyTraverseError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How many calls' leaves a call holds on a platform where it holds them: the harness's floor
/// holds each call's arrays three calls on the TPU, where letting go of an array a computation
/// may still read costs the host time (benches/floor_probe.py on the v5e: mlp_adam let go at
/// once 457.5 µs a step, held one call 414.9, three 372.4).
const HELD_CALLS: usize = 3;

/// What the native call of one `treeclone.jit` under one policy holds (see the module comment).
#[pyclass(frozen, module = "treeclone")]
pub struct LeanCall {
    /// The inner function (`Inner`), first item of the call recorded for its debug info.
    inner: Py<PyAny>,
    /// Its `jax.jit`, called as `jitted(key, donated, *kept)`.
    jitted: Py<PyAny>,
    /// The keys of its calls (`inner.keys`, `key_of` on a miss, the last one met).
    keys: Keys,
    /// `jax.core.Tracer`: an output that is one means a call inside a JAX transformation.
    tracer: Py<PyType>,
    /// `finish(call, info, outputs) -> result` for results that need Python.
    finish: Py<PyAny>,
    /// The static arguments, when the function has some: the `CallShape`'s own.
    statics: Option<Py<StaticArguments>>,
    /// The `traced=` rule (None: every leaf traced), and whether it decides by a leaf's type
    /// alone (equinox's `is_array`): then its answers are kept per type, `traced_types`.
    traced: Option<Py<PyAny>>,
    by_type: bool,
    traced_types: Mutex<Vec<(Py<PyType>, bool)>>,
    /// `in_shardings` was given: a call with keyword arguments is jax.jit's error, said by
    /// `CallShape.refuse`.
    no_keywords: bool,
    /// What `call_inner_jit` reads of the last trace's `JitRecord` (set at trace time, not changed
    /// after): read again only when another trace's comes back.
    last_info: Mutex<Option<InfoParts>>,
    /// The last flatten's entries and distinct leaves: the next one's buffers start that
    /// large (`flatten_shared_sized`).
    last_entries: AtomicUsize,
    last_leaves: AtomicUsize,
    /// The last `HELD_CALLS` calls' leaves, when their trace says so (`JitRecord.hold_inputs`,
    /// see `HOLD_INPUT_PLATFORMS` in _jit/inner.py) and they ran outside any JAX
    /// transformation: on a TPU an array whose last reference goes while a computation still
    /// reads it costs the host time, and a training loop lets go of its old state right after
    /// the call that reads it.
    held: Mutex<VecDeque<Py<PyList>>>,
    /// `jax.Array`: where the arguments are is part of a key once `keyed` is set, as
    /// `_jit.placement.placements` says (the sharding of each committed array).
    array: Py<PyType>,
    /// Set from the start with `in_shardings`, else when the inner function refused a call
    /// whose key held no shardings (`ShardedArguments`: its arguments were on several
    /// devices): from then on every key holds them.
    keyed: AtomicBool,
}

/// Of a `JitRecord`: itself, the input slots its result hands back as `jax.jit`'s arrays
/// (`returned_inputs`, strict's), whether the call's leaves are held (`hold_inputs`), the
/// outputs `traced=` left static (`static_outputs`, None when none) and its plan (whose
/// `apply` checks rule J31 itself).
struct InfoParts {
    info: Py<PyAny>,
    returned_inputs: Arc<[usize]>,
    hold_inputs: bool,
    static_outputs: Option<Py<PyAny>>,
    plan: Py<CallPlan>,
}

impl InfoParts {
    fn clone_ref(&self, py: Python<'_>) -> Self {
        InfoParts {
            info: self.info.clone_ref(py),
            returned_inputs: self.returned_inputs.clone(),
            hold_inputs: self.hold_inputs,
            static_outputs: self.static_outputs.as_ref().map(|s| s.clone_ref(py)),
            plan: self.plan.clone_ref(py),
        }
    }
}

/// What `flatten_call` hands on: the call as its trace reads it (its dynamic arguments, their
/// keyword dict and their positions among all, None: all), its structure and the static
/// arguments' key.
struct Flat<'py> {
    record: (Bound<'py, PyTuple>, Bound<'py, PyDict>, Bound<'py, PyAny>),
    sdef: Bound<'py, PyAny>,
    statics: Option<Bound<'py, PyAny>>,
    leaves: Bound<'py, PyList>,
    objects: Bound<'py, PyList>,
}

/// What `call_joining` returns: the result, the trace's `JitRecord`, the computation's
/// outputs and the call's leaves.
pub(crate) type Joined<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyList>,
);

/// A traced or compiled stage called in place of the inner jit (`call_with`): the jax
/// stage, the key it was made for, and whether that key holds the arguments' placements.
pub(crate) struct StageTarget<'py> {
    pub(crate) stage: Bound<'py, PyAny>,
    pub(crate) key: Bound<'py, PyAny>,
    pub(crate) keyed: bool,
}

#[pymethods]
impl LeanCall {
    /// `statics`: the function's `StaticArguments`, or None; `traced`: the `traced=` rule, or
    /// None, and whether it decides by type alone (`by_type`); `keyed`: calls are keyed on
    /// their arguments' placements from the start (`in_shardings`).
    #[new]
    #[pyo3(signature = (
        inner, jitted, keys, key_of, tracer, finish, array, statics=None, traced=None,
        by_type=false, keyed=false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        inner: Py<PyAny>,
        jitted: Py<PyAny>,
        keys: Py<PyDict>,
        key_of: Py<PyAny>,
        tracer: Py<PyType>,
        finish: Py<PyAny>,
        array: Py<PyType>,
        statics: Option<Py<StaticArguments>>,
        traced: Option<Py<PyAny>>,
        by_type: bool,
        keyed: bool,
    ) -> PyResult<Self> {
        Ok(LeanCall {
            inner,
            jitted,
            keys: Keys::new(keys, key_of),
            tracer,
            finish,
            statics,
            traced,
            by_type,
            traced_types: Mutex::new(Vec::new()),
            no_keywords: keyed,
            last_info: Mutex::new(None),
            last_entries: AtomicUsize::new(0),
            last_leaves: AtomicUsize::new(0),
            held: Mutex::new(VecDeque::new()),
            array,
            keyed: AtomicBool::new(keyed),
        })
    }

    /// What a call of these arguments hands its inner jit, as the running call's record
    /// (`_jit.call.lean_call_record` reads it): for tracing a stage (`jitted.trace(...)`),
    /// which calls the inner jit's own `trace`. `keyed`: its key holds the arguments'
    /// placements (a trace refused them without: `ShardedArguments`).
    #[pyo3(signature = (args, kwargs, bound=None, keyed=false))]
    fn prepare<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: &Bound<'py, PyDict>,
        bound: Option<&Bound<'py, PyAny>>,
        keyed: bool,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let flat = self.flatten_call(py, args, Some(kwargs), bound)?;
        let static_leaves = self.static_leaves(py, &flat.leaves)?;
        let keyed = keyed || self.keyed.load(Ordering::Relaxed);
        let key = self.key(py, &flat, static_leaves.as_ref(), keyed)?;
        self.record(py, &flat, key.key.bind(py))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.inner)?;
        visit.call(&self.jitted)?;
        self.keys.traverse(&visit)?;
        visit.call(&self.tracer)?;
        visit.call(&self.finish)?;
        visit.call(&self.array)?;
        if let Some(statics) = &self.statics {
            visit.call(statics)?;
        }
        if let Some(traced) = &self.traced {
            visit.call(traced)?;
        }
        if let Ok(types) = self.traced_types.try_lock() {
            for (ty, _) in types.iter() {
                visit.call(ty)?;
            }
        }
        if let Ok(last) = self.last_info.try_lock() {
            if let Some(parts) = last.as_ref() {
                visit.call(&parts.info)?;
                if let Some(static_outputs) = &parts.static_outputs {
                    visit.call(static_outputs)?;
                }
                visit.call(&parts.plan)?;
            }
        }
        if let Ok(held) = self.held.try_lock() {
            for leaves in held.iter() {
                visit.call(leaves)?;
            }
        }
        Ok(())
    }
}

impl LeanCall {
    /// Whether calls take static arguments out.
    pub(crate) fn splits_statics(&self) -> bool {
        self.statics.is_some()
    }

    /// Whether a call with keyword arguments is refused (`in_shardings`: jax.jit's error,
    /// said by `CallShape.refuse`).
    pub(crate) fn takes_no_keywords(&self) -> bool {
        self.no_keywords
    }

    /// `fun(*args, **kwargs)` under the policy, returning the result and the trace's
    /// `JitRecord`. `kwargs` is the caller's: the call makes its own dict. With `bound`
    /// (`jit_partial`'s `BoundArguments`, the first of `args`), the bound leaves are joined
    /// (`bound_join`) and followed through the write-back (`bound_advance`); with `stage`, a
    /// traced or compiled stage computes in place of the inner jit, for calls of its key
    /// only. `FlattenFailed` when the arguments cannot be flattened or differ from the
    /// stage's: nothing has run then, and Python says why.
    pub(crate) fn call_with<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        bound: Option<&Bound<'py, PyAny>>,
        stage: Option<&StageTarget<'py>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (out, info, outputs, leaves) = self.call_joining(py, args, kwargs, bound, stage)?;
        if let Some(bound) = bound {
            let next_inputs = info.getattr(intern!(py, "next_inputs"))?;
            bound_advance(bound, &next_inputs, &leaves, &outputs)?;
        }
        Ok((out, info))
    }

    /// `call_with` up to following the write-back into `bound`, which is the caller's to do
    /// (`kept.rs` decides first whether to keep its record): `(result, JitRecord, the
    /// computation's outputs, the call's leaves)`.
    pub(crate) fn call_joining<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        bound: Option<&Bound<'py, PyAny>>,
        stage: Option<&StageTarget<'py>>,
    ) -> PyResult<Joined<'py>> {
        let flat = self.flatten_call(py, args, kwargs, bound)?;
        let leaves = flat.leaves.clone();
        let (out, info, outputs) = match stage {
            None => self.key_and_call(py, flat)?,
            Some(stage) => {
                let static_leaves = self.static_leaves(py, &flat.leaves)?;
                let key = self.key(py, &flat, static_leaves.as_ref(), stage.keyed)?;
                let made_for = key.key.bind(py);
                if !(made_for.is(&stage.key) || made_for.eq(&stage.key)?) {
                    return Err(FlattenFailed::new_err(()));
                }
                self.call_inner_jit(py, &flat, key, Some(&stage.stage))?
            }
        };
        Ok((out, info, outputs, leaves))
    }

    /// The call's arguments, the static ones taken out, flattened with identity; with
    /// `bound` (`jit_partial`'s `BoundArguments`: the first arguments), only the others are
    /// flattened and joined with the bound ones' (`bound_join`). `FlattenFailed` (its cause
    /// the flatten's error) when they cannot be: nothing has run.
    fn flatten_call<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        bound: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Flat<'py>> {
        let mut items = match kwargs {
            Some(kwargs) => keyword_items(kwargs)?,
            None => Vec::new(),
        };
        if self.no_keywords && !items.is_empty() {
            return Err(FlattenFailed::new_err(()));
        }
        let statics = self.statics.as_ref().map(|statics| statics.get());
        let split = match statics {
            Some(statics) => Some(statics.split(py, args, &mut items)?),
            None => None,
        };
        let args = split.as_ref().map_or(args, |split| &split.args);
        let kwargs = sorted_dict(py, items)?;
        let flat = match bound {
            Some(bound) => bound_join(bound, args, &kwargs),
            None => self.flatten_sized(py, args, &kwargs),
        };
        let (leaves, sdef, objects) = match flat {
            Ok(flat) => flat,
            Err(e) if e.is_instance_of::<PyValueError>(py) => {
                let failed = FlattenFailed::new_err(());
                failed.set_cause(py, Some(e));
                return Err(failed);
            }
            Err(e) => return Err(e),
        };
        let (statics, positions) = match (&split, statics) {
            (Some(split), Some(statics)) => {
                // Hashed after the flatten, as jax.jit orders its errors.
                statics.check_hashable(py, split)?;
                (
                    Some(split.key.clone().into_any()),
                    split.positions.clone().into_any(),
                )
            }
            _ => (None, py.None().into_bound(py)),
        };
        Ok(Flat {
            record: (args.clone(), kwargs, positions),
            sdef,
            statics,
            leaves,
            objects,
        })
    }

    /// `flatten_shared((*args, kwargs))`, its buffers as large as the last one's.
    fn flatten_sized<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: &Bound<'py, PyDict>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyAny>, Bound<'py, PyList>)> {
        let mut arguments: Vec<Bound<'py, PyAny>> = args.iter().collect();
        arguments.push(kwargs.clone().into_any());
        let tree = PyTuple::new(py, arguments)?;
        let sizes = Sizes {
            entries: self.last_entries.load(Ordering::Relaxed),
            leaves: self.last_leaves.load(Ordering::Relaxed),
        };
        let flat = flatten_shared_sized(tree.as_any(), sizes)?;
        let sizes = flat.sizes();
        self.last_entries.store(sizes.entries, Ordering::Relaxed);
        self.last_leaves.store(sizes.leaves, Ordering::Relaxed);
        let (leaves, sdef, objects) = flat.into_python(py)?;
        Ok((leaves, sdef.into_any(), objects))
    }

    /// `call_inner_jit` with the call's key: of its structure, static arguments and static
    /// leaves, and, once calls are keyed on placements (`keyed`), of where its arguments are.
    /// A call refused for want of them (`ShardedArguments`) sets `keyed` and is made again
    /// with them.
    fn key_and_call<'py>(
        &self,
        py: Python<'py>,
        flat: Flat<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let static_leaves = self.static_leaves(py, &flat.leaves)?;
        let keyed = self.keyed.load(Ordering::Relaxed);
        let key = self.key(py, &flat, static_leaves.as_ref(), keyed)?;
        match self.call_inner_jit(py, &flat, key, None) {
            Err(err) if !keyed && err.is_instance_of::<ShardedArguments>(py) => {
                self.keyed.store(true, Ordering::Relaxed);
                let key = self.key(py, &flat, static_leaves.as_ref(), true)?;
                self.call_inner_jit(py, &flat, key, None)
            }
            result => result,
        }
    }

    /// The call as `Inner.call` reads it (made into a `JitCall` when a trace needs it).
    fn record<'py>(
        &self,
        py: Python<'py>,
        flat: &Flat<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (args, kwargs, positions) = flat.record.clone();
        PyTuple::new(
            py,
            [
                self.inner.bind(py).clone(),
                self.jitted.bind(py).clone(),
                key.clone(),
                flat.leaves.clone().into_any(),
                flat.objects.clone().into_any(),
                args.into_any(),
                kwargs.into_any(),
                positions,
            ],
        )
    }

    /// Everything after the flatten and the key: call the inner jit with the key and the
    /// leaves (or `stage`, made for that key, with the leaves), build the results from its
    /// outputs (the plan's `apply`, or `finish` in Python) and hold the leaves where the
    /// trace says so.
    fn call_inner_jit<'py>(
        &self,
        py: Python<'py>,
        flat: &Flat<'py>,
        key: LeanKey,
        stage: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let leaves = &flat.leaves;
        let objects = &flat.objects;
        // `jitted(key, donated, *kept)`; a stage has its key fixed: `stage(donated, *kept)`.
        let key_object = key.key.bind(py);
        let donated = match &key.donated {
            None => py.None().into_bound(py),
            Some(slots) => PyList::new(py, take(leaves, slots)?)?.into_any(),
        };
        let mut arguments = Vec::with_capacity(leaves.len() + 2);
        if stage.is_none() {
            arguments.push(key_object.clone());
        }
        arguments.push(donated);
        match &key.kept {
            None => arguments.extend(leaves.iter()),
            Some(slots) => arguments.extend(take(leaves, slots)?),
        }
        let arguments = PyTuple::new(py, arguments)?;
        let call = self.record(py, flat, key_object)?;
        let saved = running::swap(Some(call.clone().into_any().unbind()));
        let result = stage.unwrap_or(self.jitted.bind(py)).call1(arguments);
        drop(running::swap(saved));
        let result = result?;
        let result = result.cast::<ResultBox>()?.get();
        let info = result.info.bind(py).clone();
        let mut outputs = result.leaves.bind(py).clone();
        let parts = self.info_parts(&info)?;
        if let Some(static_outputs) = &parts.static_outputs {
            // What the function made that `traced=` leaves static comes back as it is.
            let list = PyList::new(py, outputs.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
            for entry in static_outputs.bind(py).try_iter()? {
                let (i, value): (usize, Bound<'py, PyAny>) = entry?.extract()?;
                list.set_item(i, value)?;
            }
            outputs = list.into_any();
        }
        let traced = if parts.hold_inputs {
            self.traced(&outputs)?
        } else {
            None
        };
        // Python's end: an input handed back that is not a `jax.Array` (made one as `jax.jit`
        // makes it).
        let out = if !self.all_arrays(leaves, &parts.returned_inputs)? {
            self.finish.bind(py).call1((call, &info, &outputs))?
        } else {
            parts.plan.bind(py).get().apply(leaves, objects, &outputs)?
        };
        // Inside a JAX transformation the leaves are its tracers: not held past it. A trace
        // that holds nothing lets go of what the others held.
        if parts.hold_inputs && traced == Some(false) {
            self.hold(Some(leaves.clone().unbind()));
        } else if !parts.hold_inputs {
            self.hold(None);
        }
        Ok((out, info, outputs))
    }

    /// Whether each of `slots` holds a `jax.Array` (handed back as it is: `as_jit_outputs`).
    fn all_arrays(&self, leaves: &Bound<'_, PyList>, slots: &[usize]) -> PyResult<bool> {
        let array = self.array.bind(leaves.py());
        for &s in slots {
            if !leaves.get_item(s)?.is_instance(array)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the computation's outputs are tracers, that is, whether the call ran inside a
    /// JAX transformation (None: it has no outputs to tell by).
    fn traced(&self, outputs: &Bound<'_, PyAny>) -> PyResult<Option<bool>> {
        if outputs.len()? == 0 {
            return Ok(None);
        }
        let tracer = self.tracer.bind(outputs.py());
        Ok(Some(outputs.get_item(0)?.is_instance(tracer)?))
    }

    /// Hold `leaves` for the next `HELD_CALLS` calls (None: let go of all that are held); the
    /// leaves let go are dropped after the lock is, since a finalizer may call back.
    pub(crate) fn hold(&self, leaves: Option<Py<PyList>>) {
        let gone: Vec<Py<PyList>> = {
            let Ok(mut held) = self.held.lock() else {
                return; // poisoned: nothing is held
            };
            match leaves {
                None => held.drain(..).collect(),
                Some(leaves) => {
                    held.push_back(leaves);
                    let over = held.len().saturating_sub(HELD_CALLS);
                    held.drain(..over).collect()
                }
            }
        };
        drop(gone);
    }

    /// What the call reads of `info`: the last info's when `info` is it.
    fn info_parts(&self, info: &Bound<'_, PyAny>) -> PyResult<InfoParts> {
        let py = info.py();
        if let Ok(last) = self.last_info.lock() {
            if let Some(parts) = last.as_ref().filter(|parts| parts.info.is(info)) {
                return Ok(parts.clone_ref(py));
            }
        }
        // Python code may run in these reads: nothing is held locked meanwhile.
        let static_outputs = info.getattr(intern!(py, "static_outputs"))?;
        let parts = InfoParts {
            info: info.clone().unbind(),
            returned_inputs: info
                .getattr(intern!(py, "returned_inputs"))?
                .extract::<Vec<usize>>()?
                .into(),
            hold_inputs: info.getattr(intern!(py, "hold_inputs"))?.is_truthy()?,
            static_outputs: static_outputs.is_truthy()?.then(|| static_outputs.unbind()),
            plan: info
                .getattr(intern!(py, "plan"))?
                .cast_into::<CallPlan>()?
                .unbind(),
        };
        replace_last(&self.last_info, parts.clone_ref(py));
        Ok(parts)
    }
}

/// The leaves at `slots` (each a slot of `leaves`, which the key was made for).
fn take<'py>(leaves: &Bound<'py, PyList>, slots: &[usize]) -> PyResult<Vec<Bound<'py, PyAny>>> {
    slots.iter().map(|&s| leaves.get_item(s)).collect()
}
