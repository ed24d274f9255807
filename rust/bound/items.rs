//! Containers' items recorded by identity and compared with what they hold now: a dict's
//! (with its PEP 509 version), a list's, any iterable's, and a node's children.

use super::follow::{follow_value, Followed, LeafIndex};
use crate::cpython::Internals;
use crate::keys::address::AddressMap;
use crate::sharing::SharedTreeDef;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// An iterable's items, in iteration order.
pub(super) fn iter_items(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Py<PyAny>>> {
    obj.try_iter()?.map(|i| i.map(Bound::unbind)).collect()
}

/// Whether `items` are `now`'s items, by identity, in order.
pub(super) fn same_items(now: &Bound<'_, PyAny>, items: &[Py<PyAny>]) -> PyResult<bool> {
    let mut it = now.try_iter()?;
    for old in items {
        match it.next() {
            Some(item) => {
                if !item?.is(old) {
                    return Ok(false);
                }
            }
            None => return Ok(false),
        }
    }
    Ok(it.next().is_none())
}

/// The object's `__dict__` as the interpreter stores it (`PyObject_GenericGetDict`: no
/// Python code, past a class's `__getattribute__`).
pub(super) fn stored_dict<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `obj` is alive and the GIL is held; the result is a new reference or NULL with
    // an exception set, which `from_owned_ptr_or_err` takes over.
    unsafe {
        Bound::from_owned_ptr_or_err(
            obj.py(),
            pyo3::ffi::PyObject_GenericGetDict(obj.as_ptr(), std::ptr::null_mut()),
        )
    }
}

/// The objects at the child entries of node `i` of `def` (`objects`: one per entry).
pub(super) fn children_of<'py>(
    def: &SharedTreeDef,
    objects: &Bound<'py, PyList>,
    i: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    (def.child_indices(i)?.into_iter())
        .map(|c| objects.get_item(c))
        .collect()
}

/// Whether `recorded` are `children`, in order, by identity.
pub(super) fn same_objects(
    recorded: impl ExactSizeIterator<Item = *mut pyo3::ffi::PyObject>,
    children: &[Bound<'_, PyAny>],
) -> bool {
    recorded.len() == children.len() && recorded.zip(children).all(|(r, c)| r == c.as_ptr())
}

/// A dict's items, by identity, in order, with its version tag when they were read and which
/// values are bound leaves.
pub(super) struct DictItems {
    /// The dict's PEP 509 version (`Internals::dict_version`; 0: none to go by).
    pub(super) version: u64,
    pub(super) items: Vec<(Py<PyAny>, Py<PyAny>)>,
    pub(super) followed: Followed,
}

impl DictItems {
    pub(super) fn read(gate: Internals, dict: &Bound<'_, PyDict>, index: &LeafIndex) -> Self {
        // The version first: a change after it, even during the read, makes them differ.
        let version = gate.dict_version(dict);
        let items: Vec<(Py<PyAny>, Py<PyAny>)> =
            dict.iter().map(|(k, v)| (k.unbind(), v.unbind())).collect();
        let followed = index.followed(items.iter().map(|(_, v)| v));
        DictItems {
            version,
            items,
            followed,
        }
    }

    /// Follow a call's write-back (`Watched::follow`). A value replaced leaves no version tag
    /// to go by (the dict's tag now would also stand for writes made by anything else): the
    /// items are compared one by one until the dict is read again.
    pub(super) fn follow(&mut self, leaves: &Bound<'_, PyList>, dropped: &mut Vec<Py<PyAny>>) {
        for &(at, leaf) in &self.followed {
            if let Some((_, value)) = self.items.get_mut(at as usize) {
                if follow_value(value, leaf, leaves, dropped) {
                    self.version = 0;
                }
            }
        }
    }

    /// Whether these items are the dict's flatten: `keys` (in child order, the very key
    /// objects) with `children`, by identity.
    pub(super) fn are(&self, keys: &Bound<'_, PyTuple>, children: &[Bound<'_, PyAny>]) -> bool {
        if self.items.len() != keys.len() || keys.len() != children.len() {
            return false;
        }
        // Insertion order is often the sorted one; otherwise each key is looked up.
        let in_order =
            (self.items.iter().zip(keys.iter())).all(|((k, _), key)| k.as_ptr() == key.as_ptr());
        if in_order {
            return same_objects(self.items.iter().map(|(_, v)| v.as_ptr()), children);
        }
        let mut values = AddressMap::with_capacity_and_hasher(keys.len(), Default::default());
        values.extend((self.items.iter()).map(|(k, v)| (k.as_ptr() as usize, v.as_ptr() as usize)));
        keys.iter().zip(children).all(|(key, child)| {
            values.get(&(key.as_ptr() as usize)) == Some(&(child.as_ptr() as usize))
        })
    }

    /// Whether `dict` holds exactly these items: at once when its version is the one read
    /// with them (no change since), else compared one by one (a change undone is none).
    pub(super) fn same(&self, gate: Internals, dict: &Bound<'_, PyDict>) -> bool {
        if self.version != 0 && gate.dict_version(dict) == self.version {
            return true;
        }
        // SAFETY: `dict` is alive (a Bound) and the GIL is held; nothing below runs Python.
        unsafe { same_dict_items(dict.as_ptr(), &self.items) }
    }
}

pub(super) fn same_list(list: &Bound<'_, PyList>, items: &[Py<PyAny>]) -> bool {
    list.len() == items.len() && list.iter().zip(items).all(|(a, b)| a.is(b))
}

/// Whether `dict` holds exactly `items`, in order, by identity, without taking a reference
/// to each item (this check runs at every `jit_partial` call over every bound container).
///
/// # Safety
/// `dict` must point to a live dict (or dict subclass) and the GIL must be held. The borrowed
/// references `PyDict_Next` gives are only compared by address, and no Python code (nor any
/// allocation) runs while they are held.
unsafe fn same_dict_items(
    dict: *mut pyo3::ffi::PyObject,
    items: &[(Py<PyAny>, Py<PyAny>)],
) -> bool {
    use pyo3::ffi;
    if unsafe { ffi::PyDict_Size(dict) } != items.len() as ffi::Py_ssize_t {
        return false;
    }
    let mut pos: ffi::Py_ssize_t = 0;
    let mut key: *mut ffi::PyObject = std::ptr::null_mut();
    let mut value: *mut ffi::PyObject = std::ptr::null_mut();
    for (k0, v0) in items {
        if unsafe { ffi::PyDict_Next(dict, &mut pos, &mut key, &mut value) } == 0 {
            return false;
        }
        if key != k0.as_ptr() || value != v0.as_ptr() {
            return false;
        }
    }
    true
}
