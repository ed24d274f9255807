//! `LeanCall`: one call of `treeclone.jit` under `alias` or `strict`, for a function whose
//! arguments are none donated and every leaf traced, in one native call.
//!
//! It does what `Jitted._call_policy` does for such a call, without its Python frames: take
//! the static arguments out (with the function's `StaticArguments`, the `CallShape`'s, which
//! the Python path splits its calls with too), flatten the others with identity (`flatten_shared`), find the
//! key of their structure (one key object per structure, kept by the inner function, so that
//! JAX compares it by identity), run the inner `jax.jit` on the distinct leaves
//! (`jitted(key, None, *leaves)`, the key static) with the call recorded for its debug info,
//! and apply the trace's `CallPlan`. What only some calls need stays in Python: the naming of
//! an argument that cannot be flattened (`FlattenFailed` hands the call back), and `finish`,
//! for a result that hands inputs back as `jax.jit`'s arrays (strict) or a write-back inside
//! a JAX transformation.

mod core;
mod partial;
pub(crate) mod running;
mod statics;

pub use core::JitCore;
pub use partial::PartialCore;
pub use statics::StaticArguments;
use statics::{keyword_items, sorted_dict};

use crate::sharing::{flatten_shared_sized, Sizes};
use crate::writeback::CallPlan;
use pyo3::exceptions::PyValueError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use pyo3::PyTraverseError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

pyo3::create_exception!(
    treeclone,
    FlattenFailed,
    PyValueError,
    "The arguments of a lean call could not be flattened: the caller takes the general path, \
     whose error names the argument."
);

pyo3::create_exception!(
    treeclone,
    ShardedArguments,
    FlattenFailed,
    "A call's arguments hold arrays placed on several devices and its key holds no shardings \
     (the arrays written back keep their placement, a part of the trace): the call is made \
     again with them in its key, and so are the later ones."
);

/// What the inner `jax.jit` returns: the computation's outputs (`leaves`) with the trace's
/// `_TraceInfo` (`info`) as static data, a pytree node (registered in `jit.py`). JAX makes one
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

/// What the lean path of one `treeclone.jit` under one policy holds (see the module comment).
#[pyclass(frozen, module = "treeclone")]
pub struct LeanCall {
    /// The inner function (`_Inner`), first item of the call recorded for its debug info.
    inner: Py<PyAny>,
    /// Its `jax.jit`, called as `jitted(key, None, *leaves)`.
    jitted: Py<PyAny>,
    /// `inner.keys`: the key of each structure seen; `key_of(sdef)` makes a new one.
    keys: Py<PyDict>,
    key_of: Py<PyAny>,
    /// `jax.core.Tracer`: an output that is one means a call inside a JAX transformation.
    tracer: Py<PyType>,
    /// `finish(call, info, outputs) -> result` for results that need Python.
    finish: Py<PyAny>,
    /// The static arguments, when the function has some: the `CallShape`'s own, which the
    /// Python path splits calls with too.
    statics: Option<Py<StaticArguments>>,
    /// The last structure met (with the static arguments' key) and its key: a training loop
    /// meets one structure call after call, and comparing with it costs less than hashing.
    last: Mutex<Option<Last>>,
    /// What `run` reads of the last trace's `_TraceInfo` (set at trace time, not changed
    /// after): read again only when another trace's comes back.
    last_info: Mutex<Option<InfoParts>>,
    /// The last flatten's entries and distinct leaves: the next one's buffers start that
    /// large (`flatten_shared_sized`).
    last_entries: AtomicUsize,
    last_leaves: AtomicUsize,
    /// The last call's leaves, held until the next call when its trace says so
    /// (`_TraceInfo.hold_inputs`, see `HOLD_INPUT_PLATFORMS` in jit.py) and it ran outside
    /// any JAX transformation: on a TPU an array whose last reference goes while a computation
    /// still reads it costs the host time, and a training loop lets go of its old state right
    /// after the call that reads it.
    held: Mutex<Option<Py<PyList>>>,
    /// `placements(leaves)`: the part of a key that says where the arguments are
    /// (`_lift.placement.placements`), read once `keyed` is set.
    placements: Py<PyAny>,
    /// Set when the inner function refused a call whose key held no shardings
    /// (`ShardedArguments`: its arguments were on several devices): from then on every key
    /// holds them.
    keyed: AtomicBool,
}

/// Of a `_TraceInfo`: itself, whether its result hands inputs back (`returned_inputs`),
/// whether the call's leaves are held until the next call (`hold_inputs`), and its plan
/// (whose `apply` checks rule 25a itself).
type InfoParts = (Py<PyAny>, bool, bool, Py<CallPlan>);

/// `(structure, static arguments' key or None, the call's key)`.
type Last = (Py<PyAny>, Option<Py<PyAny>>, Py<PyAny>);

#[pymethods]
impl LeanCall {
    /// `statics`: the function's `StaticArguments`, or None.
    #[new]
    #[pyo3(signature = (inner, jitted, keys, key_of, tracer, finish, placements, statics=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        inner: Py<PyAny>,
        jitted: Py<PyAny>,
        keys: Py<PyDict>,
        key_of: Py<PyAny>,
        tracer: Py<PyType>,
        finish: Py<PyAny>,
        placements: Py<PyAny>,
        statics: Option<Py<StaticArguments>>,
    ) -> PyResult<Self> {
        Ok(LeanCall {
            inner,
            jitted,
            keys,
            key_of,
            tracer,
            finish,
            statics,
            last: Mutex::new(None),
            last_info: Mutex::new(None),
            last_entries: AtomicUsize::new(0),
            last_leaves: AtomicUsize::new(0),
            held: Mutex::new(None),
            placements,
            keyed: AtomicBool::new(false),
        })
    }

    /// The call for `jit_partial`, whose bound arguments (the first of `args`) were flattened
    /// already: `(leaves, sdef, objects)` is `flatten_shared((*args, kwargs))` (`kwargs`
    /// sorted). Returns `(result, the trace's _TraceInfo, the computation's outputs)`.
    fn call_joined<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: &Bound<'py, PyDict>,
        leaves: Bound<'py, PyList>,
        sdef: Bound<'py, PyAny>,
        objects: Bound<'py, PyList>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let record = (args.clone(), kwargs.clone(), py.None().into_bound(py));
        self.run_keyed(py, record, &sdef, None, leaves, objects)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.inner)?;
        visit.call(&self.jitted)?;
        visit.call(&self.keys)?;
        visit.call(&self.key_of)?;
        visit.call(&self.tracer)?;
        visit.call(&self.finish)?;
        visit.call(&self.placements)?;
        if let Some(statics) = &self.statics {
            visit.call(statics)?;
        }
        if let Ok(last) = self.last.try_lock() {
            if let Some((sdef, statics, key)) = last.as_ref() {
                visit.call(sdef)?;
                if let Some(statics) = statics {
                    visit.call(statics)?;
                }
                visit.call(key)?;
            }
        }
        if let Ok(last) = self.last_info.try_lock() {
            if let Some((info, _, _, plan)) = last.as_ref() {
                visit.call(info)?;
                visit.call(plan)?;
            }
        }
        if let Ok(held) = self.held.try_lock() {
            if let Some(held) = held.as_ref() {
                visit.call(held)?;
            }
        }
        Ok(())
    }
}

impl LeanCall {
    /// `fun(*args, **kwargs)` under the policy; `FlattenFailed` when the arguments cannot be
    /// flattened (nothing was run). `kwargs` is the caller's: the call makes its own dict.
    pub(crate) fn call<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.call_traced(py, args, kwargs)?.0)
    }

    /// `call`, returning `(result, the trace's _TraceInfo, the computation's outputs)`.
    pub(crate) fn call_traced<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let mut items = match kwargs {
            Some(kwargs) => keyword_items(kwargs)?,
            None => Vec::new(),
        };
        let statics = self.statics.as_ref().map(|statics| statics.get());
        let split = match statics {
            Some(statics) => Some(statics.split(py, args, &mut items)?),
            None => None,
        };
        let args = split.as_ref().map_or(args, |split| &split.args);
        let kwargs = sorted_dict(py, items)?;
        let mut arguments: Vec<Bound<'py, PyAny>> = args.iter().collect();
        arguments.push(kwargs.clone().into_any());
        let tree = PyTuple::new(py, arguments)?;
        let sizes = Sizes {
            entries: self.last_entries.load(Ordering::Relaxed),
            leaves: self.last_leaves.load(Ordering::Relaxed),
        };
        let (leaves, sdef, objects) = match flatten_shared_sized(tree.as_any(), sizes) {
            Ok(flat) => {
                let sizes = flat.sizes();
                self.last_entries.store(sizes.entries, Ordering::Relaxed);
                self.last_leaves.store(sizes.leaves, Ordering::Relaxed);
                flat.into_python(py)?
            }
            Err(e) if e.is_instance_of::<PyValueError>(py) => {
                return Err(FlattenFailed::new_err(()));
            }
            Err(e) => return Err(e),
        };
        let sdef = sdef.into_any();
        let (statics, positions) = match (&split, statics) {
            (Some(split), Some(statics)) => {
                // Hashed after the flatten, as jax.jit orders its errors.
                statics.check_hashable(py, split)?;
                (Some(split.key.as_any()), split.positions.clone().into_any())
            }
            _ => (None, py.None().into_bound(py)),
        };
        let record = (args.clone(), kwargs, positions);
        self.run_keyed(py, record, &sdef, statics, leaves, objects)
    }

    /// `run` with the call's key: of its structure and static arguments, and, once calls
    /// are keyed on placements (`keyed`), of where its arguments are. A call refused for
    /// want of them (`ShardedArguments`) sets `keyed` and is made again with them.
    fn run_keyed<'py>(
        &self,
        py: Python<'py>,
        record: (Bound<'py, PyTuple>, Bound<'py, PyDict>, Bound<'py, PyAny>),
        sdef: &Bound<'py, PyAny>,
        statics: Option<&Bound<'py, PyAny>>,
        leaves: Bound<'py, PyList>,
        objects: Bound<'py, PyList>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let keyed = self.keyed.load(Ordering::Relaxed);
        let placed = self.placed(py, keyed, &leaves)?;
        let key = self.key(py, sdef, statics, placed.as_ref())?;
        match self.run(py, record.clone(), key, leaves.clone(), objects.clone()) {
            Err(err) if !keyed && err.is_instance_of::<ShardedArguments>(py) => {
                self.keyed.store(true, Ordering::Relaxed);
                let placed = self.placed(py, true, &leaves)?;
                let key = self.key(py, sdef, statics, placed.as_ref())?;
                self.run(py, record, key, leaves, objects)
            }
            result => result,
        }
    }

    /// Where the arguments are (`placements(leaves)`), when calls are keyed on it.
    fn placed<'py>(
        &self,
        py: Python<'py>,
        keyed: bool,
        leaves: &Bound<'py, PyList>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if !keyed {
            return Ok(None);
        }
        Ok(Some(self.placements.bind(py).call1((leaves,))?))
    }

    /// The key of structure `sdef` (with the static arguments' `statics`, and the arguments'
    /// `placed`): the last one's when equal, else the inner function's (`key_of(sdef,
    /// statics, placed)`), kept under `sdef`, or `(sdef, statics)`, or `(sdef, (statics,
    /// placed))` when keyed on placements.
    fn key<'py>(
        &self,
        py: Python<'py>,
        sdef: &Bound<'py, PyAny>,
        statics: Option<&Bound<'py, PyAny>>,
        placed: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Compared and looked up beside the structure: the static arguments and, when keyed on
        // them, the arguments' placements.
        let given = statics;
        let extra = match placed {
            None => given.cloned(),
            Some(placed) => {
                let statics = given.cloned().unwrap_or_else(|| py.None().into_bound(py));
                Some(PyTuple::new(py, [&statics, placed])?.into_any())
            }
        };
        let statics = extra.as_ref();
        if let Some((last_sdef, last_statics, key)) = self.last_entry(py) {
            // Python code may run in `eq` (a node's data, a static value's `__eq__`): nothing
            // is held locked meanwhile.
            let same_statics = match (&last_statics, statics) {
                (None, None) => true,
                (Some(a), Some(b)) => a.is(b) || a.bind(py).eq(b)?,
                _ => false,
            };
            if same_statics && (last_sdef.is(sdef) || last_sdef.bind(py).eq(sdef)?) {
                return Ok(key.into_bound(py));
            }
        }
        let lookup = match statics {
            None => sdef.clone(),
            Some(statics) => PyTuple::new(py, [sdef, statics])?.into_any(),
        };
        let key = match self.keys.bind(py).get_item(&lookup)? {
            Some(key) => key,
            None => self.key_of.bind(py).call1((sdef, given, placed))?,
        };
        if let Ok(mut last) = self.last.lock() {
            *last = Some((
                sdef.clone().unbind(),
                statics.map(|s| s.clone().unbind()),
                key.clone().unbind(),
            ));
        }
        Ok(key)
    }

    fn last_entry(&self, py: Python<'_>) -> Option<Last> {
        let last = self.last.lock().ok()?;
        last.as_ref().map(|(sdef, statics, key)| {
            (
                sdef.clone_ref(py),
                statics.as_ref().map(|s| s.clone_ref(py)),
                key.clone_ref(py),
            )
        })
    }

    /// Everything after the flatten and the key: the inner jit, the plan. `record`:
    /// the call's dynamic arguments, as `_Inner.call` names them, and their positions among
    /// all the positional ones (None: all of them).
    fn run<'py>(
        &self,
        py: Python<'py>,
        record: (Bound<'py, PyTuple>, Bound<'py, PyDict>, Bound<'py, PyAny>),
        key: Bound<'py, PyAny>,
        leaves: Bound<'py, PyList>,
        objects: Bound<'py, PyList>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (args, kwargs, positions) = record;
        // `jitted(key, None, *leaves)`: nothing donated, every leaf kept.
        let mut arguments = Vec::with_capacity(leaves.len() + 2);
        arguments.push(key.clone());
        arguments.push(py.None().into_bound(py));
        arguments.extend(leaves.iter());
        let arguments = PyTuple::new(py, arguments)?;
        // The call as `_Inner.call` reads it (a `_Call`'s fields, made into one at trace time).
        let call = PyTuple::new(
            py,
            [
                self.inner.bind(py).clone(),
                self.jitted.bind(py).clone(),
                key,
                leaves.clone().into_any(),
                objects.clone().into_any(),
                args.into_any(),
                kwargs.into_any(),
                positions,
            ],
        )?;
        let saved = running::swap(Some(call.clone().into_any().unbind()));
        let result = self.jitted.bind(py).call1(arguments);
        drop(running::swap(saved));
        let result = result?;
        let result = result.cast::<ResultBox>()?.get();
        let info = result.info.bind(py).clone();
        let outputs = result.leaves.bind(py).clone();
        let (returns_inputs, hold_inputs, plan) = self.info_parts(&info)?;
        let traced = if hold_inputs {
            self.traced(&outputs)?
        } else {
            None
        };
        let out = if returns_inputs {
            self.finish.bind(py).call1((call, &info, &outputs))?
        } else {
            plan.bind(py).get().apply(py, &leaves, &objects, &outputs)?
        };
        // Inside a JAX transformation the leaves are its tracers: not held past it.
        let hold = hold_inputs && traced == Some(false);
        self.hold(hold.then(|| leaves.unbind()));
        Ok((out, info, outputs))
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

    /// Hold `leaves` until the next call (None: hold nothing); the leaves held before are let
    /// go after the lock is, since a finalizer may call back.
    pub(crate) fn hold(&self, leaves: Option<Py<PyList>>) {
        let before = {
            let Ok(mut held) = self.held.lock() else {
                return; // poisoned: nothing is held
            };
            std::mem::replace(&mut *held, leaves)
        };
        drop(before);
    }

    /// `(info.returned_inputs, info.hold_inputs, info.plan)`, the first two as bools: the
    /// last info's when `info` is it.
    fn info_parts(&self, info: &Bound<'_, PyAny>) -> PyResult<(bool, bool, Py<CallPlan>)> {
        let py = info.py();
        if let Ok(last) = self.last_info.lock() {
            if let Some((last, returns_inputs, hold_inputs, plan)) = last.as_ref() {
                if last.is(info) {
                    return Ok((*returns_inputs, *hold_inputs, plan.clone_ref(py)));
                }
            }
        }
        // Python code may run in these reads: nothing is held locked meanwhile.
        let returns_inputs = info.getattr(intern!(py, "returned_inputs"))?.is_truthy()?;
        let hold_inputs = info.getattr(intern!(py, "hold_inputs"))?.is_truthy()?;
        let plan = info
            .getattr(intern!(py, "plan"))?
            .cast_into::<CallPlan>()?
            .unbind();
        if let Ok(mut last) = self.last_info.lock() {
            *last = Some((
                info.clone().unbind(),
                returns_inputs,
                hold_inputs,
                plan.clone_ref(py),
            ));
        }
        Ok((returns_inputs, hold_inputs, plan))
    }
}
