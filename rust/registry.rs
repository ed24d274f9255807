//! Which Python types are pytree nodes, and how to take them apart and put them back.
//!
//! JAX's registry is the single source of truth: list, tuple, dict and None are dispatched on
//! their exact type pointer; every other type is classified once through
//! `treeclone._jax_compat.classify_type` and cached here. JAX's Python-side registry only grows,
//! so a change in its size means a type was registered since: the cache is then dropped.

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A type registered with JAX through one of its registration functions.
pub struct CustomType {
    pub ty: Py<PyType>,
    /// `obj -> (children, aux_data)`
    pub flatten: Py<PyAny>,
    /// `(aux_data, children_tuple) -> obj`
    pub unflatten: Py<PyAny>,
}

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

impl Kind {
    pub fn code(&self) -> u8 {
        match self {
            Kind::Leaf => 0,
            Kind::None => 1,
            Kind::Tuple => 2,
            Kind::List => 3,
            Kind::Dict => 4,
            Kind::NamedTuple => 5,
            Kind::Custom(_) => 6,
        }
    }

    pub fn same(&self, other: &Kind) -> bool {
        match (self, other) {
            (Kind::Custom(a), Kind::Custom(b)) => a.ty.is(&b.ty),
            _ => self.code() == other.code(),
        }
    }
}

/// Objects from the Python side, fetched once.
pub struct Compat {
    pub classify_type: Py<PyAny>,
    pub registry: Py<PyDict>,
    pub sequence_key: Py<PyAny>,
    pub dict_key: Py<PyAny>,
    pub getattr_key: Py<PyAny>,
    pub flattened_index_key: Py<PyAny>,
    pub flatten_one_level_with_keys: Py<PyAny>,
    pub keystr: Py<PyAny>,
    pub to_jax_node: Py<PyAny>,
}

static COMPAT: PyOnceLock<Compat> = PyOnceLock::new();

pub fn compat(py: Python<'_>) -> PyResult<&Compat> {
    COMPAT.get_or_try_init(py, || {
        let m = py.import("treeclone._jax_compat")?;
        let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(m.getattr(name)?.unbind()) };
        Ok(Compat {
            classify_type: get("classify_type")?,
            registry: m.getattr("registry")?.cast_into::<PyDict>()?.unbind(),
            sequence_key: get("SequenceKey")?,
            dict_key: get("DictKey")?,
            getattr_key: get("GetAttrKey")?,
            flattened_index_key: get("FlattenedIndexKey")?,
            flatten_one_level_with_keys: get("flatten_one_level_with_keys")?,
            keystr: get("keystr")?,
            to_jax_node: get("to_jax_node")?,
        })
    })
}

/// Per-type answers for non-builtin types. Holding the type object keeps its address from
/// being reused by another type while the entry lives.
struct TypeCache {
    registry_len: isize,
    map: HashMap<usize, (Py<PyType>, Kind)>,
}

/// Bounds memory for programs that create many classes (e.g. a namedtuple per call).
const TYPE_CACHE_MAX: usize = 4096;

static TYPE_CACHE: Mutex<Option<TypeCache>> = Mutex::new(None);

fn lock_cache() -> std::sync::MutexGuard<'static, Option<TypeCache>> {
    // A poisoned lock only means another thread panicked while holding it; the cache holds
    // no invariant that a panic could break, so keep using it.
    TYPE_CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drop every cached classification (after a registration).
pub fn invalidate() {
    let old = lock_cache().take();
    drop(old); // decrefs happen outside the lock
}

/// Classifies the objects of one traversal. Trees hold few distinct types, so a short list of
/// the types seen so far answers almost every lookup without touching the shared cache. Each
/// entry holds its type, so a remembered address cannot be reused by another type.
pub struct Classifier<'py> {
    seen: Vec<(Bound<'py, PyType>, Kind)>,
    /// Size of JAX's registry when `seen` was filled: a flatten function (or is_leaf) may
    /// register a type mid-traversal, and then the memo is dropped.
    registry_len: usize,
    /// Python code ran since the registry size was last read (see `python_ran`).
    recheck: bool,
}

const CLASSIFIER_MEMO: usize = 8;

impl<'py> Classifier<'py> {
    pub fn new() -> Self {
        Classifier {
            seen: Vec::new(),
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

    /// The node kind of `obj`, as JAX's default registry sees it.
    #[inline]
    pub fn classify(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<Kind> {
        // SAFETY: `obj` is a live object; reading its type pointer has no other requirement.
        let ty = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
        if ty == &raw mut ffi::PyDict_Type {
            return Ok(Kind::Dict);
        }
        if ty == &raw mut ffi::PyList_Type {
            return Ok(Kind::List);
        }
        if ty == &raw mut ffi::PyTuple_Type {
            return Ok(Kind::Tuple);
        }
        if obj.is_none() {
            return Ok(Kind::None);
        }
        let py = obj.py();
        if self.recheck || self.seen.is_empty() {
            self.recheck = false;
            let registry_len = compat(py)?.registry.bind(py).len();
            if registry_len != self.registry_len {
                self.seen.clear();
                self.registry_len = registry_len;
            }
        }
        for (seen, kind) in &self.seen {
            if seen.as_ptr() as *mut ffi::PyTypeObject == ty {
                return Ok(kind.clone());
            }
        }
        let ty = obj.get_type();
        let kind = classify_type(py, &ty)?;
        if self.seen.len() < CLASSIFIER_MEMO {
            self.seen.push((ty, kind.clone()));
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
    // SAFETY: `obj` is a live object; reading its type pointer has no other requirement.
    let ty = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    if ty == &raw mut ffi::PyDict_Type {
        return Ok(Kind::Dict);
    }
    if ty == &raw mut ffi::PyList_Type {
        return Ok(Kind::List);
    }
    if ty == &raw mut ffi::PyTuple_Type {
        return Ok(Kind::Tuple);
    }
    if obj.is_none() {
        return Ok(Kind::None);
    }
    classify_type(obj.py(), &obj.get_type())
}

/// The node kind of a type that is not list, tuple, dict or NoneType.
pub fn classify_type(py: Python<'_>, ty: &Bound<'_, PyType>) -> PyResult<Kind> {
    let compat = compat(py)?;
    let registry_len = compat.registry.bind(py).len() as isize;
    let key = ty.as_ptr() as usize;
    let stale = {
        let mut guard = lock_cache();
        match guard.as_ref() {
            Some(cache) if cache.registry_len == registry_len => {
                if let Some((_, kind)) = cache.map.get(&key) {
                    return Ok(kind.clone());
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
    let answer = answer.cast::<PyTuple>()?;
    let code: u8 = answer.get_item(0)?.extract()?;
    let kind = match code {
        0 => Kind::Leaf,
        1 => Kind::NamedTuple,
        2 => Kind::Custom(Arc::new(CustomType {
            ty: ty.clone().unbind(),
            flatten: answer.get_item(1)?.unbind(),
            unflatten: answer.get_item(2)?.unbind(),
        })),
        _ => {
            return Err(PyRuntimeError::new_err(
                "treeclone: bad answer from classify_type",
            ))
        }
    };

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
        if cache.registry_len == registry_len {
            cache.map.insert(key, (ty.clone().unbind(), kind.clone()));
        }
        evicted
    };
    drop(evicted);
    Ok(kind)
}

/// The kind used to rebuild a node of type `ty` (from a pickle or a JAX treedef).
pub fn kind_for_type(py: Python<'_>, ty: &Bound<'_, PyType>) -> PyResult<Kind> {
    let p = ty.as_ptr() as *mut ffi::PyTypeObject;
    if p == &raw mut ffi::PyDict_Type {
        return Ok(Kind::Dict);
    }
    if p == &raw mut ffi::PyList_Type {
        return Ok(Kind::List);
    }
    if p == &raw mut ffi::PyTuple_Type {
        return Ok(Kind::Tuple);
    }
    if ty.is(py.None().bind(py).get_type()) {
        return Ok(Kind::None);
    }
    classify_type(py, ty)
}
