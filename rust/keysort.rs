//! Dict children in JAX's order: sorted keys.
//!
//! Sorting dominates flattening wide dicts, and a training loop flattens dicts with the same key
//! objects in the same insertion order every step. For dicts whose keys are all exact `str`
//! (immutable, so their order cannot change) the sorted order is cached, keyed by the identity of
//! the keys in insertion order. A cache entry holds strong references to its keys, so an address
//! in it can never be reused by another object while the entry lives: equal addresses mean the
//! very same keys, and the cached order is exact.
//!
//! The cache and the scratch buffers are per thread: no lock on the hot path (a training loop
//! flattens from one thread), and a thread never sees another's entries half-built.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// Sorted keys of a dict and, for each sorted position, the key's insertion index.
pub struct KeyOrder {
    insertion_keys: Vec<Py<PyAny>>,
    pub order: Vec<u32>,
    pub sorted: Py<PyTuple>,
}

/// The map key is already a hash of the key addresses.
#[derive(Default)]
struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys are hashed")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type OrderMap = HashMap<u64, Rc<KeyOrder>, BuildHasherDefault<PassThroughHasher>>;

const ORDER_CACHE_MAX: usize = 1024;

/// Borrowed key and value pointers of the dict being sorted (reused: no allocation per dict).
type Scratch = (Vec<*mut ffi::PyObject>, Vec<*mut ffi::PyObject>);

thread_local! {
    static ORDER_CACHE: RefCell<OrderMap> = RefCell::new(OrderMap::default());
    static SCRATCH: RefCell<Scratch> = const { RefCell::new((Vec::new(), Vec::new())) };
}

#[inline]
fn fingerprint(keys: &[*mut ffi::PyObject]) -> u64 {
    let mut h: u64 = keys.len() as u64;
    for &k in keys {
        h = (h.rotate_left(5) ^ (k as u64)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h
}

/// UTF-8 bytes of an exact `str`; byte order of UTF-8 equals code point order, which is how
/// Python compares strings. `None` for strings that cannot be encoded (lone surrogates).
fn utf8_bytes<'a>(key: *mut ffi::PyObject) -> Option<&'a [u8]> {
    let mut size: ffi::Py_ssize_t = 0;
    // SAFETY: `key` is an exact str kept alive by the dict (no Python code runs meanwhile);
    // the buffer is cached inside the str object and lives as long as it does.
    unsafe {
        let data = ffi::PyUnicode_AsUTF8AndSize(key, &mut size);
        if data.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(std::slice::from_raw_parts(data as *const u8, size as usize))
    }
}

/// Append the dict's values to `values` in sorted-key order and return the sorted keys.
pub fn sorted_children(
    py: Python<'_>,
    dict: &Bound<'_, PyDict>,
    values: &mut Vec<Py<PyAny>>,
) -> PyResult<Py<PyTuple>> {
    let n = dict.len();
    if n == 0 {
        return Ok(PyTuple::empty(py).unbind());
    }
    if n > u32::MAX as usize {
        return Err(PyValueError::new_err("dict too large to flatten"));
    }
    // Exact-str keys: the cached (or natively computed) order. No Python code runs in this
    // block, so the dict cannot change and the scratch buffers cannot be borrowed twice.
    let done = SCRATCH.with(|cell| -> Option<Py<PyTuple>> {
        let mut scratch = cell.try_borrow_mut().ok()?;
        let (keys, insertion_values) = &mut *scratch;
        keys.clear();
        insertion_values.clear();
        // SAFETY: PyDict_Next yields borrowed references owned by `dict`, which we hold; no
        // Python code runs until the values are increfed below and the keys are done with.
        unsafe {
            let mut pos: ffi::Py_ssize_t = 0;
            let mut k: *mut ffi::PyObject = std::ptr::null_mut();
            let mut v: *mut ffi::PyObject = std::ptr::null_mut();
            while ffi::PyDict_Next(dict.as_ptr(), &mut pos, &mut k, &mut v) != 0 {
                if ffi::PyUnicode_CheckExact(k) == 0 {
                    return None;
                }
                keys.push(k);
                insertion_values.push(v);
            }
        }
        let order = str_key_order(py, keys)?;
        values.reserve(n);
        for &i in &order.order {
            // SAFETY: borrowed from the dict, still alive (see above).
            values.push(
                unsafe { Bound::from_borrowed_ptr(py, insertion_values[i as usize]) }.unbind(),
            );
        }
        Some(order.sorted.clone_ref(py))
    });
    if let Some(sorted) = done {
        return Ok(sorted);
    }
    generic_sorted_children(py, dict, values)
}

/// Sorted order of exact-str keys, from the cache or computed natively.
fn str_key_order(py: Python<'_>, keys: &[*mut ffi::PyObject]) -> Option<Rc<KeyOrder>> {
    let fp = fingerprint(keys);
    let hit = ORDER_CACHE.with(|cell| {
        let cache = cell.borrow();
        let entry = cache.get(&fp)?;
        let same = entry.insertion_keys.len() == keys.len()
            && entry
                .insertion_keys
                .iter()
                .zip(keys)
                .all(|(a, &b)| a.as_ptr() == b);
        same.then(|| entry.clone())
    });
    if hit.is_some() {
        return hit;
    }
    let mut slices: Vec<&[u8]> = Vec::with_capacity(keys.len());
    for &k in keys {
        slices.push(utf8_bytes(k)?);
    }
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| slices[a as usize].cmp(slices[b as usize]));
    // SAFETY: the keys are alive (borrowed from the dict, no Python code ran).
    let sorted = PyTuple::new(
        py,
        order
            .iter()
            .map(|&i| unsafe { Bound::from_borrowed_ptr(py, keys[i as usize]) }),
    )
    .ok()?
    .unbind();
    let entry = Rc::new(KeyOrder {
        insertion_keys: keys
            .iter()
            .map(|&k| unsafe { Bound::from_borrowed_ptr(py, k) }.unbind())
            .collect(),
        order,
        sorted,
    });
    let evicted = ORDER_CACHE.with(|cell| {
        let mut cache = cell.borrow_mut();
        let evicted = if cache.len() >= ORDER_CACHE_MAX {
            std::mem::take(&mut *cache)
        } else {
            OrderMap::default()
        };
        cache.insert(fp, entry.clone());
        evicted
    });
    drop(evicted); // decrefs of exact str keys: no Python code runs
    Some(entry)
}

/// Keys of any type: sort them with Python's `<`, exactly as JAX does.
fn generic_sorted_children(
    py: Python<'_>,
    dict: &Bound<'_, PyDict>,
    values: &mut Vec<Py<PyAny>>,
) -> PyResult<Py<PyTuple>> {
    let keys: Bound<'_, PyList> = dict.keys();
    if let Err(err) = keys.sort() {
        let new = PyValueError::new_err(
            "Comparator raised exception while sorting pytree dictionary keys.",
        );
        new.set_cause(py, Some(err));
        return Err(new);
    }
    for key in keys.iter() {
        match dict.get_item(&key)? {
            Some(v) => values.push(v.unbind()),
            None => {
                return Err(PyRuntimeError::new_err(
                    "dictionary changed while its keys were being sorted",
                ))
            }
        }
    }
    Ok(keys.to_tuple().unbind())
}

/// Forget this thread's cached orders (tests and memory-conscious callers).
pub fn clear_cache() {
    let old = ORDER_CACHE.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    drop(old);
}
