//! The leaves of `jit_partial`'s bound arguments between calls: whether a call's own
//! arguments share one of them (`any_identical`), and where each is after a write-back
//! (`Taker`). Both run at every call over every bound leaf, so neither takes a reference to
//! an item it only looks at: touching each array's reference count costs more than the rest.

use crate::writeback::Outputs;
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::collections::HashSet;

/// Whether any of `these` is, by identity, an item of `those`: whether a `jit_partial` call's
/// own arguments share an object with the bound arguments' leaves (a set of their ids, made
/// again after every write-back, cost more than the rest of the check).
#[pyfunction]
pub fn any_identical(these: &Bound<'_, PyList>, those: &Bound<'_, PyList>) -> bool {
    // Nothing below runs Python code or allocates a Python object, so neither list can
    // change while its addresses are read.
    let these: Vec<usize> = addresses(these).collect();
    if these.is_empty() {
        return false;
    }
    if these.len() <= 8 {
        return addresses(those).any(|at| these.contains(&at));
    }
    let those: HashSet<usize> = addresses(those).collect();
    these.iter().any(|at| those.contains(at))
}

/// The addresses of `list`'s items, in order, read without taking a reference to any. The
/// caller must not let Python code run while it iterates (the list could shrink meanwhile).
fn addresses<'a>(list: &'a Bound<'_, PyList>) -> impl Iterator<Item = usize> + 'a {
    // The length is read at each step: `item_address` never reads past the end.
    (0..).map_while(move |i| (i < list.len()).then(|| unsafe { item_address(list, i) }))
}

/// The address of `list[i]`.
///
/// # Safety
/// `i` must be less than the list's length now (the GIL is held through `list`).
unsafe fn item_address(list: &Bound<'_, PyList>, i: usize) -> usize {
    // SAFETY: by the caller, `i` is in range; the item pointer is only read, not kept as a
    // reference.
    unsafe { pyo3::ffi::PyList_GET_ITEM(list.as_ptr(), i as pyo3::ffi::Py_ssize_t) as usize }
}

/// `Taker(indices)(first, second)` is `[(first + second)[i] for i in indices]`, without the
/// joined list: where a `jit_partial` call's write-back left each bound leaf, among the
/// call's input leaves (`first`) and the computation's outputs (`second`).
#[pyclass(frozen, module = "treeclone._native")]
pub struct Taker {
    indices: Vec<usize>,
}

#[pymethods]
impl Taker {
    #[new]
    fn new(indices: Vec<usize>) -> Self {
        Taker { indices }
    }

    fn __call__<'py>(
        &self,
        first: &Bound<'py, PyList>,
        second: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let second = Outputs::of(second).ok_or_else(|| {
            PyTypeError::new_err("Taker: the second argument is no list or tuple")
        })?;
        // Taken as references first: the list made below may start the GC, whose finalizers
        // could change `first` or `second`.
        let n = first.len();
        let mut taken = Vec::with_capacity(self.indices.len());
        for &i in &self.indices {
            let item = if i < n {
                first.get_item(i)
            } else {
                second.get(i - n)
            };
            taken.push(item.map_err(|_| {
                PyIndexError::new_err(format!(
                    "Taker: index {i} out of range of {n} and {} items",
                    second.len()
                ))
            })?);
        }
        PyList::new(first.py(), taken)
    }

    fn __len__(&self) -> usize {
        self.indices.len()
    }
}
