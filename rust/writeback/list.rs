//! Writing a list (or list subclass) in place: whole, or only the entries the function changed.

use super::undo::Undo;
use pyo3::prelude::*;
use pyo3::types::{PyList, PySlice};

/// Replace all items of a list (or list subclass, through its own `__setitem__`).
pub(super) fn set_list_items(list: &Bound<'_, PyAny>, items: &Bound<'_, PyAny>) -> PyResult<()> {
    list.set_item(PySlice::full(list.py()), items)
}

/// Give the list (or list subclass) `list` the items of `items` in place; returns how to undo
/// it.
pub(super) fn write_list<'py>(
    list: &Bound<'py, PyAny>,
    items: &Bound<'py, PyAny>,
) -> PyResult<Undo<'py>> {
    let old = PyList::new(list.py(), list.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
    set_list_items(list, items)?;
    Ok(Undo::List(list.clone(), old))
}

/// Give the list (or list subclass) `list` the items `new` where they differ from `old`, its
/// items at call start, by identity (rule J20): the indices the function changed are set one
/// by one, and a resized list gets its tail from the shorter length on replaced by one slice
/// assignment; everything else is left as it is now. Returns how to undo it.
pub(super) fn write_list_entries<'py>(
    list: &Bound<'py, PyAny>,
    new: &[Bound<'py, PyAny>],
    old: &[Bound<'py, PyAny>],
) -> PyResult<Undo<'py>> {
    let py = list.py();
    let common = new.len().min(old.len());
    let mut set = Vec::new();
    let mut tail = None;
    let mut write = || -> PyResult<()> {
        for j in 0..common {
            if !new[j].is(&old[j]) {
                let before = list.get_item(j)?;
                list.set_item(j, &new[j])?;
                set.push((j, before));
            }
        }
        if new.len() != old.len() {
            let slice = PySlice::new(py, common as isize, old.len() as isize, 1);
            let before = list.get_item(&slice)?;
            list.set_item(&slice, PyList::new(py, &new[common..])?)?;
            tail = Some((common, new.len() - common, before));
        }
        Ok(())
    };
    let written = write();
    Undo::ListEntries(list.clone(), set, tail).kept_or_applied(written)
}
