//! The key of a `LeanCall`'s call: what the inner jit is called with besides the leaves
//! (one key object per structure, static values, `traced=` static leaves and placements, kept
//! by the inner function so that JAX compares it by identity), with the order the inner jit
//! takes the leaves in (the kept ones, the donated ones). The last key met is compared first
//! (a training loop meets one structure call after call); a new one is `key_of`'s, in Python.

use super::{Flat, LeanCall};
use crate::call::replace_last;
use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::PyTraverseError;
use std::sync::{Arc, Mutex};

/// Where a `LeanCall` finds the key of a call: the inner function's keys, the Python function
/// that makes a new one, and the last key met (compared before any lookup).
pub(super) struct Keys {
    /// `inner.keys`: what `key_of` made for each structure seen (`LeanKey`'s Python form).
    known: Py<PyDict>,
    /// `key_of(sdef, statics, placed, static_leaves, positions, args, kwargs)`: on a cache
    /// miss, `(key, kept, donated)`, the key and the slots the inner jit takes as its kept and
    /// donated arguments (each None: every slot kept, nothing donated).
    key_of: Py<PyAny>,
    /// The last key met: a training loop meets one structure call after call, and comparing
    /// with it costs less than hashing.
    last: Mutex<Option<Last>>,
}

impl Keys {
    pub(super) fn new(known: Py<PyDict>, key_of: Py<PyAny>) -> Self {
        Keys {
            known,
            key_of,
            last: Mutex::new(None),
        }
    }

    /// The part of `LeanCall.__traverse__` that visits what the keys hold.
    pub(super) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.known)?;
        visit.call(&self.key_of)?;
        if let Ok(last) = self.last.try_lock() {
            if let Some((sdef, extra, key)) = last.as_ref() {
                visit.call(sdef)?;
                if let Some(extra) = extra {
                    visit.call(extra)?;
                }
                visit.call(&key.key)?;
            }
        }
        Ok(())
    }

    /// The last key met, as new references: the caller compares it unlocked (Python runs).
    fn last_entry(&self, py: Python<'_>) -> Option<Last> {
        let last = self.last.lock().ok()?;
        last.as_ref().map(|(sdef, extra, key)| {
            (
                sdef.clone_ref(py),
                extra.as_ref().map(|s| s.clone_ref(py)),
                key.clone_ref(py),
            )
        })
    }
}

/// A call's key with the order the inner jit takes its leaves in: the slots of the kept
/// leaves and of the donated ones (None: every slot kept, in order; nothing donated).
pub(super) struct LeanKey {
    pub(super) key: Py<PyAny>,
    pub(super) kept: Option<Arc<[usize]>>,
    pub(super) donated: Option<Arc<[usize]>>,
}

/// `(structure, what else the key depends on or None, its LeanKey)`.
type Last = (Py<PyAny>, Option<Py<PyAny>>, LeanKey);

impl LeanKey {
    pub(super) fn clone_ref(&self, py: Python<'_>) -> Self {
        LeanKey {
            key: self.key.clone_ref(py),
            kept: self.kept.clone(),
            donated: self.donated.clone(),
        }
    }

    /// From `key_of`'s `(key, kept, donated)`.
    pub(super) fn from_python(made: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (key, kept, donated): (Py<PyAny>, Option<Vec<usize>>, Option<Vec<usize>>) =
            made.extract()?;
        Ok(LeanKey {
            key,
            kept: kept.map(Arc::from),
            donated: donated.map(Arc::from),
        })
    }
}

impl LeanCall {
    /// The leaves the `traced=` rule leaves static, as `((slot, type, value), ...)` (None:
    /// none, or no rule).
    pub(super) fn static_leaves<'py>(
        &self,
        py: Python<'py>,
        leaves: &Bound<'py, PyList>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(rule) = &self.traced else {
            return Ok(None);
        };
        let mut entries = Vec::new();
        for (slot, leaf) in leaves.iter().enumerate() {
            if !self.is_traced(rule.bind(py), &leaf)? {
                let ty = leaf.get_type().into_any();
                entries.push(PyTuple::new(
                    py,
                    [slot.into_pyobject(py)?.into_any(), ty, leaf],
                )?);
            }
        }
        if entries.is_empty() {
            return Ok(None);
        }
        Ok(Some(PyTuple::new(py, entries)?))
    }

    /// Whether the `traced=` rule traces `leaf`: asked once per type when it decides by type.
    pub(super) fn is_traced(
        &self,
        rule: &Bound<'_, PyAny>,
        leaf: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        if !self.by_type {
            return rule.call1((leaf,))?.is_truthy();
        }
        let ty = leaf.get_type();
        if let Ok(types) = self.traced_types.lock() {
            if let Some((_, answer)) = types.iter().find(|(t, _)| t.is(&ty)) {
                return Ok(*answer);
            }
        }
        // Python code runs in the rule: nothing is held locked meanwhile.
        let answer = rule.call1((leaf,))?.is_truthy()?;
        if let Ok(mut types) = self.traced_types.lock() {
            if types.len() < TRACED_TYPES {
                types.push((ty.unbind(), answer));
            }
        }
        Ok(answer)
    }

    /// The key of the call (and the order of its leaves): the last one's when the structure
    /// and the rest are equal, else the inner function's for them (`keys`), else made by
    /// `key_of` and kept there.
    pub(super) fn key<'py>(
        &self,
        py: Python<'py>,
        flat: &Flat<'py>,
        static_leaves: Option<&Bound<'py, PyTuple>>,
        keyed: bool,
    ) -> PyResult<LeanKey> {
        let placed = if keyed {
            Some(self.placements(py, &flat.leaves)?.into_any())
        } else {
            None
        };
        let sdef = &flat.sdef;
        let statics = flat.statics.as_ref();
        // What the key depends on beside the structure: None when nothing.
        let extra = if statics.is_none() && static_leaves.is_none() && placed.is_none() {
            None
        } else {
            let none = || py.None().into_bound(py);
            Some(
                PyTuple::new(
                    py,
                    [
                        statics.cloned().unwrap_or_else(none),
                        static_leaves
                            .map(|s| s.clone().into_any())
                            .unwrap_or_else(none),
                        placed.clone().unwrap_or_else(none),
                    ],
                )?
                .into_any(),
            )
        };
        if let Some((last_sdef, last_extra, key)) = self.keys.last_entry(py) {
            // Python code may run in `eq` (a node's data, a static value's `__eq__`): nothing
            // is held locked meanwhile.
            let same_extra = match (&last_extra, &extra) {
                (None, None) => true,
                (Some(a), Some(b)) => a.is(b) || a.bind(py).eq(b)?,
                _ => false,
            };
            if same_extra && (last_sdef.is(sdef) || last_sdef.bind(py).eq(sdef)?) {
                return Ok(key);
            }
        }
        let lookup = match &extra {
            None => sdef.clone(),
            Some(extra) => PyTuple::new(py, [sdef, extra])?.into_any(),
        };
        let keys = self.keys.known.bind(py);
        let found = match keys.get_item(&lookup) {
            Ok(found) => found,
            // A static leaf that cannot be hashed: `key_of` names it.
            Err(err) if err.is_instance_of::<PyTypeError>(py) => None,
            Err(err) => return Err(err),
        };
        let made = match found {
            Some(made) => made,
            None => {
                let (args, kwargs, positions) = &flat.record;
                let made = self.keys.key_of.bind(py).call1((
                    sdef,
                    statics,
                    placed.as_ref(),
                    static_leaves,
                    positions,
                    args,
                    kwargs,
                ))?;
                if keys.len() >= KEY_CACHE_SIZE {
                    keys.clear();
                }
                keys.set_item(&lookup, &made)?;
                made
            }
        };
        let key = LeanKey::from_python(&made)?;
        let kept = key.clone_ref(py);
        replace_last(
            &self.keys.last,
            (sdef.clone().unbind(), extra.map(Bound::unbind), kept),
        );
        Ok(key)
    }

    /// Per leaf, the sharding of a committed `jax.Array` (None for any other leaf): where the
    /// arguments are, as `_jit.placement.placements` says.
    pub(super) fn placements<'py>(
        &self,
        py: Python<'py>,
        leaves: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (array, tracer) = (self.array.bind(py), self.tracer.bind(py));
        let mut placed = Vec::with_capacity(leaves.len());
        for leaf in leaves.iter() {
            let committed = leaf.is_instance(array)?
                && !leaf.is_instance(tracer)?
                && leaf.getattr(intern!(py, "committed"))?.is_truthy()?;
            placed.push(if committed {
                leaf.getattr(intern!(py, "sharding"))?
            } else {
                py.None().into_bound(py)
            });
        }
        PyTuple::new(py, placed)
    }
}

/// How many keys an inner function keeps (cleared when full), and how many types a `traced=`
/// rule's answers are kept for.
const KEY_CACHE_SIZE: usize = 256;
const TRACED_TYPES: usize = 64;
