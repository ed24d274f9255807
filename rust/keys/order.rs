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
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use std::cell::RefCell;
use std::rc::Rc;

use super::address::{insert_bounded, AddressMap};

/// Sorted keys of a dict and, for each sorted position, the key's insertion index.
pub struct KeyOrder {
    insertion_keys: Vec<Py<PyAny>>,
    pub order: Vec<u32>,
    pub sorted: Py<PyTuple>,
}

/// Keyed by a fingerprint of the key addresses (see `fingerprint`).
type OrderMap = AddressMap<u64, Rc<KeyOrder>>;

const ORDER_CACHE_MAX: usize = 1024;

/// Key and value pointers of the dict being scanned (reused: no allocation per dict). They are
/// borrowed, so they are only read while no Python code can run; see `scan_str_keys`.
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

/// Fill `keys` and `values` with the dict's borrowed key and value pointers, in insertion order.
/// False (and partial contents) when a key is not an exact `str`.
///
/// # Safety
/// The pointers are borrowed from `dict`: the caller may only use them while no Python code can
/// run. Any Python object allocation can start the cyclic GC, whose finalizers may mutate or
/// free `dict`'s contents, so the caller must turn every pointer it still needs into a strong
/// reference (an incref, which allocates nothing) before it allocates or calls into Python.
unsafe fn scan_str_keys(
    dict: &Bound<'_, PyDict>,
    keys: &mut Vec<*mut ffi::PyObject>,
    values: &mut Vec<*mut ffi::PyObject>,
) -> bool {
    let mut pos: ffi::Py_ssize_t = 0;
    let mut k: *mut ffi::PyObject = std::ptr::null_mut();
    let mut v: *mut ffi::PyObject = std::ptr::null_mut();
    while ffi::PyDict_Next(dict.as_ptr(), &mut pos, &mut k, &mut v) != 0 {
        if ffi::PyUnicode_CheckExact(k) == 0 {
            return false;
        }
        keys.push(k);
        values.push(v);
    }
    true
}

/// What the scan of an exact-str-keyed dict found.
enum StrScan<'py> {
    /// A key is not an exact str (or the scratch buffers are in use by an outer traversal that
    /// Python code re-entered): sort generically.
    Generic,
    /// The order was cached; the values are already appended.
    Hit(Py<PyTuple>),
    /// Not cached: strong references to the keys and values, in insertion order.
    Miss(Vec<Bound<'py, PyAny>>, Vec<Py<PyAny>>),
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
    match sorted_str_children(py, dict, values) {
        Some(sorted) => Ok(sorted),
        None => generic_sorted_children(py, dict, values),
    }
}

/// `sorted_children`'s native path, for a dict whose keys are all exact `str` that encode as
/// UTF-8; None otherwise (nothing appended), where the caller has its own way
/// (`sorted_children` sorts with Python's `<`; flax's flatten functions, run natively in
/// `node::known`, hand such dicts to the Python function).
pub fn sorted_str_children(
    py: Python<'_>,
    dict: &Bound<'_, PyDict>,
    values: &mut Vec<Py<PyAny>>,
) -> Option<Py<PyTuple>> {
    if dict.is_empty() {
        return Some(PyTuple::empty(py).unbind());
    }
    match scan(py, dict, values) {
        StrScan::Hit(sorted) => Some(sorted),
        StrScan::Miss(keys, insertion_values) => {
            let order = str_key_order(py, keys)?;
            values.reserve(order.order.len());
            for &i in &order.order {
                values.push(insertion_values[i as usize].clone_ref(py));
            }
            Some(order.sorted.clone_ref(py))
        }
        // Nothing was appended (`scan` appends only on a hit).
        StrScan::Generic => None,
    }
}

/// The allocation-free part of the exact-str path: scan the dict and look its key order up.
/// Everything it hands back is a strong reference.
fn scan<'py>(
    py: Python<'py>,
    dict: &Bound<'py, PyDict>,
    values: &mut Vec<Py<PyAny>>,
) -> StrScan<'py> {
    SCRATCH.with(|cell| {
        let Ok(mut scratch) = cell.try_borrow_mut() else {
            return StrScan::Generic;
        };
        let (keys, insertion_values) = &mut *scratch;
        keys.clear();
        insertion_values.clear();
        // SAFETY: until every pointer we keep is increfed below, this block allocates no Python
        // object and calls no Python code (Rust allocations and increfs cannot run Python).
        unsafe {
            if !scan_str_keys(dict, keys, insertion_values) {
                return StrScan::Generic;
            }
            if let Some(order) = cached_order(keys) {
                values.reserve(keys.len());
                for &i in &order.order {
                    let v = insertion_values[i as usize];
                    values.push(Bound::from_borrowed_ptr(py, v).unbind());
                }
                return StrScan::Hit(order.sorted.clone_ref(py));
            }
            let strong = |p: &*mut ffi::PyObject| Bound::from_borrowed_ptr(py, *p).unbind();
            StrScan::Miss(
                keys.iter().map(|p| strong(p).into_bound(py)).collect(),
                insertion_values.iter().map(strong).collect(),
            )
        }
    })
}

/// The cached order for exactly these keys (same objects, same insertion order), if any.
fn cached_order(keys: &[*mut ffi::PyObject]) -> Option<Rc<KeyOrder>> {
    let fp = fingerprint(keys);
    ORDER_CACHE.with(|cell| {
        let cache = cell.try_borrow().ok()?;
        let entry = cache.get(&fp)?;
        let same = entry.insertion_keys.len() == keys.len()
            && entry
                .insertion_keys
                .iter()
                .zip(keys)
                .all(|(a, &b)| a.as_ptr() == b);
        same.then(|| entry.clone())
    })
}

/// The order Python's `<` puts distinct keys in, as their indices, computed natively when every
/// key is an exact `str` that encodes as UTF-8 (UTF-8 byte order is code point order, how
/// Python compares strings); None otherwise (a `str` subclass may compare its own way).
pub fn str_order<'a, 'py: 'a>(
    keys: impl ExactSizeIterator<Item = &'a Bound<'py, PyAny>>,
) -> Option<Vec<u32>> {
    let mut slices: Vec<&[u8]> = Vec::with_capacity(keys.len());
    for k in keys {
        // The buffer is cached inside the str, which the caller keeps alive.
        slices.push(k.cast_exact::<PyString>().ok()?.to_str().ok()?.as_bytes());
    }
    let mut order: Vec<u32> = (0..slices.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| slices[a as usize].cmp(slices[b as usize]));
    Some(order)
}

/// Sorted order of exact-str keys (strong references, insertion order), computed natively and
/// cached. None when a key cannot be encoded as UTF-8 (a lone surrogate).
fn str_key_order(py: Python<'_>, keys: Vec<Bound<'_, PyAny>>) -> Option<Rc<KeyOrder>> {
    let order = str_order(keys.iter())?;
    let sorted = PyTuple::new(py, order.iter().map(|&i| &keys[i as usize]))
        .ok()?
        .unbind();
    let raw: Vec<*mut ffi::PyObject> = keys.iter().map(|k| k.as_ptr()).collect();
    let fp = fingerprint(&raw);
    let entry = Rc::new(KeyOrder {
        insertion_keys: keys.into_iter().map(Bound::unbind).collect(),
        order,
        sorted,
    });
    ORDER_CACHE.with(|cache| insert_bounded(cache, fp, entry.clone(), ORDER_CACHE_MAX));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted_keys(py: Python<'_>, dict: &Bound<'_, PyDict>) -> (Vec<String>, Vec<i64>) {
        let mut values = Vec::new();
        let keys = sorted_children(py, dict, &mut values).unwrap();
        let keys = keys.bind(py).iter().map(|k| k.to_string()).collect();
        let values = values.iter().map(|v| v.extract(py).unwrap()).collect();
        (keys, values)
    }

    #[test]
    fn str_keys_sort_by_code_point_and_the_cached_order_is_the_same() {
        Python::attach(|py| {
            let dict = PyDict::new(py);
            for (i, k) in ["b", "a", "é", "Z", "aa"].iter().enumerate() {
                dict.set_item(k, i).unwrap();
            }
            let expected = (
                vec!["Z".into(), "a".into(), "aa".into(), "b".into(), "é".into()],
                vec![3, 1, 4, 0, 2],
            );
            assert_eq!(sorted_keys(py, &dict), expected);
            assert_eq!(sorted_keys(py, &dict), expected); // from the cache
        });
    }

    #[test]
    fn other_keys_sort_with_pythons_comparison() {
        Python::attach(|py| {
            let dict = PyDict::new(py);
            for (i, k) in [3, 1, 2].iter().enumerate() {
                dict.set_item(k, i).unwrap();
            }
            let (keys, values) = sorted_keys(py, &dict);
            assert_eq!(keys, vec!["1", "2", "3"]);
            assert_eq!(values, vec![1, 2, 0]);
        });
    }
}
