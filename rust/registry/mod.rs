//! Which Python types are pytree nodes, and how to take them apart and put them back.
//!
//! JAX's registry is the single source of truth: list, tuple, dict and None are dispatched on
//! their exact type pointer (`builtin_kind`, the one fast path); every other type is classified
//! once through `treeclone._jax_compat.classify_type` and cached here. JAX's Python-side
//! registry only grows, so a change in its size means a type was registered since: the cache is
//! then dropped.

mod compat;
mod custom;

pub use compat::{at_top_level, compat};
pub use custom::{Check, CustomType, Known, KnownFlatten};

use crate::cpython::SlotReader;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType, PyWeakrefMethods, PyWeakrefReference};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What JAX's registry says an object is.
#[derive(Clone)]
pub enum Kind {
    Leaf,
    None,
    Tuple,
    List,
    Dict,
    NamedTuple,
    Custom(Arc<CustomType>),
}

/// `classify_type`'s answer for a type that is not list, tuple, dict or NoneType; Python
/// returns it as `(TypeKind, flatten, unflatten)`.
#[pyclass(frozen, eq, skip_from_py_object, module = "treeclone._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TypeKind {
    Leaf,
    NamedTuple,
    Custom,
    /// Custom, with flax nnx's `Pytree._pytree__flatten` (run natively: `node::known`).
    NnxPytree,
    /// Custom, with flax nnx's `_variable_flatten` (run natively: `node::known`).
    NnxVariable,
    /// Custom, with flax nnx's `_flatten_pytree_state` (run natively: `node::known`).
    NnxPytreeState,
    /// Custom, with flax nnx's `_state_flatten` (`nnx.State`: run natively: `node::known`).
    NnxState,
    /// Custom, registered by `jax.tree_util.register_dataclass`, whose flatten reads the
    /// fields `classify_type` names as a fourth item (run natively: `node::known`).
    Dataclass,
    /// Custom, with the flatten equinox generates for the type, which reads nothing but the
    /// instance dict (run in Python; `jit_partial`'s snapshot trusts its watch of the dict).
    EqxModule,
}

/// The kind of an object whose type is list, tuple, dict or NoneType, from the type pointer
/// alone; None for every other type.
#[inline(always)]
fn builtin_kind(ty: *mut ffi::PyTypeObject) -> Option<Kind> {
    if ty == &raw mut ffi::PyDict_Type {
        Some(Kind::Dict)
    } else if ty == &raw mut ffi::PyList_Type {
        Some(Kind::List)
    } else if ty == &raw mut ffi::PyTuple_Type {
        Some(Kind::Tuple)
    } else if ty == none_type() {
        Some(Kind::None)
    } else {
        None
    }
}

/// NoneType (not exported by the C API under a name).
#[inline(always)]
fn none_type() -> *mut ffi::PyTypeObject {
    // SAFETY: None is immortal and always initialized once an interpreter runs.
    unsafe { ffi::Py_TYPE(ffi::Py_None()) }
}

/// The type pointer of a live object.
#[inline(always)]
pub fn type_ptr(obj: &Bound<'_, PyAny>) -> *mut ffi::PyTypeObject {
    // SAFETY: `obj` is a live object, so its type pointer is valid to read.
    unsafe { ffi::Py_TYPE(obj.as_ptr()) }
}

/// Per-type answers for non-builtin types, keyed by the type's address. Each entry holds a
/// weak reference to its type, so the cache keeps no class alive (as JAX's own registry
/// does not): an entry whose type died, or whose address now belongs to another type, is
/// stale and answered afresh.
struct TypeCache {
    registry_len: usize,
    map: HashMap<usize, (Py<PyWeakrefReference>, Kind)>,
}

/// Bounds memory for programs that create many classes (e.g. a namedtuple per call).
const TYPE_CACHE_MAX: usize = 4096;

static TYPE_CACHE: Mutex<Option<TypeCache>> = Mutex::new(None);

fn lock_cache() -> std::sync::MutexGuard<'static, Option<TypeCache>> {
    // A poisoned lock only means another thread panicked while holding it; the cache holds
    // no invariant that a panic could break, so keep using it.
    TYPE_CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The size of JAX's registry: it only grows, so a different size means a type was registered
/// since (what was a leaf may now be a node).
pub fn registry_size(py: Python<'_>) -> PyResult<usize> {
    Ok(compat(py)?.registry.bind(py).len())
}

/// Drop every cached classification (after a registration).
pub fn invalidate() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    let old = lock_cache().take();
    drop(old); // decrefs happen outside the lock
}

/// Counts `invalidate` calls: a thread's `LAST_TYPE` from an earlier count is stale.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

/// The last answer of `classify_type` in this thread, with what it holds for: the registry's
/// size, `GENERATION`, the type's address and a weak reference to it. Most traversals meet
/// one type that needs it (JAX's array), so this answers them without the shared cache's lock.
type LastType = (usize, usize, usize, Py<PyWeakrefReference>, Kind);

thread_local! {
    static LAST_TYPE: RefCell<Option<LastType>> = const { RefCell::new(None) };
}

fn last_type(py: Python<'_>, ty: &Bound<'_, PyType>, registry_len: usize) -> Option<Kind> {
    let generation = GENERATION.load(Ordering::Relaxed);
    LAST_TYPE.with(|last| {
        // Nothing here runs Python code: the weak reference's upgrade only reads it.
        let last = last.borrow();
        let (len, gen, key, weak, kind) = last.as_ref()?;
        let same = *len == registry_len && *gen == generation && *key == ty.as_ptr() as usize;
        (same && weak.bind(py).upgrade().is_some_and(|t| t.is(ty))).then(|| kind.clone())
    })
}

fn remember_type(ty: &Bound<'_, PyType>, registry_len: usize, kind: &Kind) {
    let Ok(weak) = PyWeakrefReference::new(ty) else {
        return;
    };
    let generation = GENERATION.load(Ordering::Relaxed);
    let entry = (
        registry_len,
        generation,
        ty.as_ptr() as usize,
        weak.unbind(),
        kind.clone(),
    );
    // The old entry is dropped after the cell is let go: its decrefs may run Python code.
    let old = LAST_TYPE.with(|last| last.replace(Some(entry)));
    drop(old);
}

/// Classifies the objects of one traversal. Trees hold few distinct types, so a short list of
/// the types seen so far answers almost every lookup without touching the shared cache. Each
/// entry holds its type, so a remembered address cannot be reused by another type.
pub struct Classifier<'py> {
    seen: [Option<(Bound<'py, PyType>, Kind)>; CLASSIFIER_MEMO],
    /// How many of `seen` are filled (in order).
    filled: usize,
    /// Size of JAX's registry when `seen` was filled: a flatten function (or is_leaf) may
    /// register a type mid-traversal, and then the memo is dropped.
    registry_len: usize,
    /// Python code ran since the registry size was last read (see `python_ran`).
    recheck: bool,
}

/// An nnx model with its optimizer meets a dozen node types or more (Modules, Variables, the
/// optimizer's, optax's): each past the memo costs a lookup in the shared cache.
const CLASSIFIER_MEMO: usize = 32;

impl<'py> Classifier<'py> {
    pub fn new() -> Self {
        Classifier {
            seen: Default::default(),
            filled: 0,
            registry_len: 0,
            recheck: false,
        }
    }

    /// Say that user code (a flatten function, is_leaf) ran: it may have registered a type,
    /// so the memo is checked against the registry before its next use.
    #[inline]
    pub fn python_ran(&mut self) {
        self.recheck = true;
    }

    /// The node kind of `obj`, as JAX's default registry sees it. Inlined where it is called:
    /// most objects a traversal meets are a builtin container or of a type already in the memo.
    #[inline(always)]
    pub fn classify(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<Kind> {
        let ty = type_ptr(obj);
        match self.known(ty) {
            Some(kind) => Ok(kind),
            None => self.classify_other(obj, ty),
        }
    }

    /// The node kind of objects of type `ty` if it is a builtin container or in the memo (and
    /// no Python code ran since the memo was checked): found without running Python code.
    #[inline(always)]
    pub fn known(&self, ty: *mut ffi::PyTypeObject) -> Option<Kind> {
        if let Some(kind) = builtin_kind(ty) {
            return Some(kind);
        }
        if self.recheck {
            return None;
        }
        self.remembered(ty)
    }

    /// The memo's kind for objects of type `ty`.
    #[inline(always)]
    fn remembered(&self, ty: *mut ffi::PyTypeObject) -> Option<Kind> {
        self.seen[..self.filled]
            .iter()
            .flatten()
            .find(|(seen, _)| seen.as_ptr() as *mut ffi::PyTypeObject == ty)
            .map(|(_, kind)| kind.clone())
    }

    /// `classify` past its fast path: if Python code ran, the registry checked and the memo
    /// (which `known` then passed over) searched, then the caches shared by every traversal.
    #[inline(never)]
    fn classify_other(
        &mut self,
        obj: &Bound<'py, PyAny>,
        ty: *mut ffi::PyTypeObject,
    ) -> PyResult<Kind> {
        let py = obj.py();
        if self.recheck || self.filled == 0 {
            self.recheck = false;
            let registry_len = registry_size(py)?;
            if registry_len != self.registry_len {
                self.seen = Default::default();
                self.filled = 0;
                self.registry_len = registry_len;
            } else if let Some(kind) = self.remembered(ty) {
                return Ok(kind);
            }
        }
        let ty = obj.get_type();
        let kind = classify_type(py, &ty)?;
        if self.filled < CLASSIFIER_MEMO {
            self.seen[self.filled] = Some((ty, kind.clone()));
            self.filled += 1;
        }
        Ok(kind)
    }
}

impl Default for Classifier<'_> {
    fn default() -> Self {
        Self::new()
    }
}

/// The node kind of `obj`, as JAX's default registry sees it.
pub fn classify(obj: &Bound<'_, PyAny>) -> PyResult<Kind> {
    match builtin_kind(type_ptr(obj)) {
        Some(kind) => Ok(kind),
        None => classify_type(obj.py(), &obj.get_type()),
    }
}

/// The node kind of any type (used to rebuild a node from a pickle or a JAX treedef).
pub fn kind_for_type(py: Python<'_>, ty: &Bound<'_, PyType>) -> PyResult<Kind> {
    match builtin_kind(ty.as_ptr() as *mut ffi::PyTypeObject) {
        Some(kind) => Ok(kind),
        None => classify_type(py, ty),
    }
}

/// The node kind of a type that is not list, tuple, dict or NoneType.
fn classify_type(py: Python<'_>, ty: &Bound<'_, PyType>) -> PyResult<Kind> {
    let compat = compat(py)?;
    let registry_len = registry_size(py)?;
    if let Some(kind) = last_type(py, ty, registry_len) {
        return Ok(kind);
    }
    let key = ty.as_ptr() as usize;
    let stale = {
        let mut guard = lock_cache();
        match guard.as_ref() {
            Some(cache) if cache.registry_len == registry_len => {
                if let Some((weak, kind)) = cache.map.get(&key) {
                    if weak.bind(py).upgrade().is_some_and(|t| t.is(ty)) {
                        let kind = kind.clone();
                        drop(guard);
                        remember_type(ty, registry_len, &kind);
                        return Ok(kind);
                    }
                }
                None
            }
            _ => guard.replace(TypeCache {
                registry_len,
                map: HashMap::new(),
            }),
        }
    };
    drop(stale);

    // Python code runs here: no lock is held.
    let answer = compat.classify_type.bind(py).call1((ty,))?;
    let kind = kind_of_answer(ty, &answer)?;

    // Types that take no weak reference are answered each time rather than kept alive.
    let weak = PyWeakrefReference::new(ty).ok().map(Bound::unbind);
    let evicted = {
        let mut guard = lock_cache();
        let cache = guard.get_or_insert_with(|| TypeCache {
            registry_len,
            map: HashMap::new(),
        });
        let evicted = if cache.map.len() >= TYPE_CACHE_MAX {
            std::mem::take(&mut cache.map)
        } else {
            HashMap::new()
        };
        let stale = match (cache.registry_len == registry_len, weak) {
            (true, Some(weak)) => cache.map.insert(key, (weak, kind.clone())),
            _ => None,
        };
        (evicted, stale)
    };
    drop(evicted);
    Ok(kind)
}

/// The kind `classify_type` answered for `ty`: `(TypeKind, flatten, unflatten[, fields])`.
fn kind_of_answer(ty: &Bound<'_, PyType>, answer: &Bound<'_, PyAny>) -> PyResult<Kind> {
    let bad =
        || PyTypeError::new_err("treeclone: classify_type must return (TypeKind, f, g[, fields])");
    let answer = answer.cast::<PyTuple>().map_err(|_| bad())?;
    if answer.len() != 3 && answer.len() != 4 {
        return Err(bad());
    }
    let type_kind = *answer
        .get_item(0)?
        .cast::<TypeKind>()
        .map_err(|_| bad())?
        .get();
    let known = match type_kind {
        TypeKind::Leaf => return Ok(Kind::Leaf),
        TypeKind::NamedTuple => return Ok(Kind::NamedTuple),
        TypeKind::NnxPytree => Some(Known::Pytree),
        TypeKind::NnxVariable => Some(Known::Variable {
            value: SlotReader::new(),
            metadata: SlotReader::new(),
        }),
        TypeKind::NnxPytreeState => Some(Known::PytreeState {
            initializing: SlotReader::new(),
            is_setup: SlotReader::new(),
        }),
        TypeKind::NnxState => Some(Known::State),
        TypeKind::Dataclass => {
            let (data, meta) = answer
                .get_item(3)?
                .extract::<(Vec<Py<PyString>>, Vec<Py<PyString>>)>()
                .map_err(|_| bad())?;
            Some(Known::Dataclass { data, meta })
        }
        TypeKind::Custom | TypeKind::EqxModule => None,
    };
    Ok(Kind::Custom(Arc::new(CustomType {
        ty: ty.clone().unbind(),
        flatten: answer.get_item(1)?.unbind(),
        unflatten: answer.get_item(2)?.unbind(),
        known: known.map(KnownFlatten::new),
        reads_only_dict: type_kind == TypeKind::EqxModule,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_classified_by_type_pointer_alone() {
        Python::attach(|py| {
            let kind = |code: &str| {
                let obj = py.eval(&std::ffi::CString::new(code).unwrap(), None, None);
                builtin_kind(type_ptr(&obj.unwrap()))
            };
            assert!(matches!(kind("{}"), Some(Kind::Dict)));
            assert!(matches!(kind("[]"), Some(Kind::List)));
            assert!(matches!(kind("()"), Some(Kind::Tuple)));
            assert!(matches!(kind("None"), Some(Kind::None)));
            assert!(kind("1").is_none());
            assert!(kind("__import__('collections').OrderedDict()").is_none());
        });
    }
}
