//! `Snapshot`: what the containers of `jit_partial`'s bound arguments hold, by identity, so
//! that a call can tell cheaply whether anything changed them since they were flattened.
//!
//! Each container's items (a list's or dict's) and instance attributes (its `__dict__`) are
//! recorded as the objects they are. A call compares them, in Rust, without running Python
//! code: a leaf or child replaced, a key or attribute added or removed, a list resized all
//! show. Objects with `__slots__` have their slots read through their member descriptors. A
//! registered node whose state is in none of these cannot be checked this way: the snapshot
//! says so (`checkable`), and the bound arguments are flattened again at each call instead.

use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};
use std::collections::HashMap;

/// A slot's member descriptor and the value it held (None: unset).
type SlotValue = (Py<PyAny>, Option<Py<PyAny>>);

/// One watched object and what it held.
enum Watched {
    List(Py<PyAny>, Vec<Py<PyAny>>),
    Dict(Py<PyAny>, Vec<(Py<PyAny>, Py<PyAny>)>),
    /// An object's `__dict__` and its items.
    Attributes(Py<PyDict>, Vec<(Py<PyAny>, Py<PyAny>)>),
    /// An object, and for each of its slots the member descriptor and the value (None: unset).
    Slots(Py<PyAny>, Vec<SlotValue>),
}

impl Watched {
    /// The same object watched again, with what it holds now.
    fn again(&self, py: Python<'_>) -> PyResult<Watched> {
        Ok(match self {
            Watched::List(obj, _) => {
                let items = obj.bind(py).cast::<PyList>().map(list_items)?;
                Watched::List(obj.clone_ref(py), items)
            }
            Watched::Dict(obj, _) => {
                let items = obj.bind(py).cast::<PyDict>().map(dict_items)?;
                Watched::Dict(obj.clone_ref(py), items)
            }
            Watched::Attributes(attrs, _) => {
                Watched::Attributes(attrs.clone_ref(py), dict_items(attrs.bind(py)))
            }
            Watched::Slots(obj, slots) => {
                let descrs = slots.iter().map(|(d, _)| d.bind(py).clone()).collect();
                Watched::Slots(obj.clone_ref(py), slot_values(obj.bind(py), descrs)?)
            }
        })
    }

    fn unchanged(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(match self {
            Watched::List(obj, items) => obj
                .bind(py)
                .cast::<PyList>()
                .is_ok_and(|l| same_list(l, items)),
            Watched::Dict(obj, items) => obj
                .bind(py)
                .cast::<PyDict>()
                .is_ok_and(|d| same_dict(d, items)),
            Watched::Attributes(attrs, items) => same_dict(attrs.bind(py), items),
            Watched::Slots(obj, slots) => {
                for (descr, value) in slots {
                    let now = read_slot(obj.bind(py), descr.bind(py))?;
                    let same = match (&now, value) {
                        (Some(a), Some(b)) => a.is(b),
                        (None, None) => true,
                        _ => false,
                    };
                    if !same {
                        return Ok(false);
                    }
                }
                true
            }
        })
    }
}

/// The value of the slot whose member descriptor is `descr` on `obj`, or None when unset:
/// read through the descriptor itself, as `object.__getattribute__` would after finding it,
/// past a class's own `__getattribute__` (nnx's `Variable` has one: Python code there would
/// cost more than the rest of the check).
fn read_slot<'py>(
    obj: &Bound<'py, PyAny>,
    descr: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    // SAFETY: `descr` is alive, so is its type; reading a type slot has no side effects.
    let get = unsafe { (*pyo3::ffi::Py_TYPE(descr.as_ptr())).tp_descr_get };
    let Some(get) = get else {
        return Ok(Some(descr.clone())); // not a descriptor any more: a plain class attribute
    };
    // SAFETY: all three pointers come from live objects and the GIL is held; the result is a
    // new reference or NULL with an exception set, which `from_owned_ptr_or_err` takes over.
    let value = unsafe {
        let ty = pyo3::ffi::Py_TYPE(obj.as_ptr()).cast::<pyo3::ffi::PyObject>();
        Bound::from_owned_ptr_or_err(py, get(descr.as_ptr(), obj.as_ptr(), ty))
    };
    match value {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => Ok(None),
        Err(e) => Err(e),
    }
}

fn slot_values<'py>(
    obj: &Bound<'py, PyAny>,
    descrs: Vec<Bound<'py, PyAny>>,
) -> PyResult<Vec<SlotValue>> {
    descrs
        .into_iter()
        .map(|d| {
            let v = read_slot(obj, &d)?.map(Bound::unbind);
            Ok((d.unbind(), v))
        })
        .collect()
}

/// The member descriptors of the slots of `ty` and its bases.
fn slot_descriptors<'py>(ty: &Bound<'py, PyType>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = ty.py();
    let mut descrs = Vec::new();
    for klass in ty.getattr(pyo3::intern!(py, "__mro__"))?.try_iter()? {
        let klass = klass?;
        let namespace = klass.getattr(pyo3::intern!(py, "__dict__"))?;
        let Ok(slots) = namespace.get_item("__slots__") else {
            continue;
        };
        let slots: Vec<Bound<'py, PyAny>> = if slots.is_instance_of::<PyString>() {
            vec![slots]
        } else {
            slots.try_iter()?.collect::<PyResult<_>>()?
        };
        let class_name: String = klass.getattr(pyo3::intern!(py, "__name__"))?.extract()?;
        for slot in slots {
            let name: String = slot.extract()?;
            if name == "__dict__" || name == "__weakref__" {
                continue;
            }
            // Private names are stored mangled, as Python stores them.
            let stored = if name.starts_with("__") && !name.ends_with("__") {
                format!("_{}{}", class_name.trim_start_matches('_'), name)
            } else {
                name
            };
            if let Ok(descr) = namespace.get_item(&stored) {
                descrs.push(descr);
            }
        }
    }
    Ok(descrs)
}

fn list_items(list: &Bound<'_, PyList>) -> Vec<Py<PyAny>> {
    list.iter().map(Bound::unbind).collect()
}

fn dict_items(dict: &Bound<'_, PyDict>) -> Vec<(Py<PyAny>, Py<PyAny>)> {
    dict.iter().map(|(k, v)| (k.unbind(), v.unbind())).collect()
}

fn same_list(list: &Bound<'_, PyList>, items: &[Py<PyAny>]) -> bool {
    list.len() == items.len() && list.iter().zip(items).all(|(a, b)| a.is(b))
}

fn same_dict(dict: &Bound<'_, PyDict>, items: &[(Py<PyAny>, Py<PyAny>)]) -> bool {
    // SAFETY: `dict` is alive (a Bound) and the GIL is held; nothing below runs Python code.
    unsafe { same_dict_items(dict.as_ptr(), items) }
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

/// The contents, by identity, of the containers among some objects (see the module comment).
#[pyclass(module = "treeclone._native")]
pub struct Snapshot {
    watched: Vec<Watched>,
    /// The node (index into the objects taken) each watched entry belongs to.
    owners: Vec<usize>,
    /// False when some container's state is out of reach (see the module comment).
    #[pyo3(get)]
    checkable: bool,
}

#[pymethods]
impl Snapshot {
    /// Record the containers among `objects` (a flatten's objects, leaves included: those are
    /// skipped). Tuples, namedtuples and None are immutable and need no record; their items
    /// are among `objects` themselves.
    #[staticmethod]
    fn take(objects: &Bound<'_, PyList>, containers: Vec<usize>) -> PyResult<Self> {
        let py = objects.py();
        let mut watched = Vec::new();
        let mut owners = Vec::new();
        let mut checkable = true;
        // Slot descriptors by type: many objects share a few types (an nnx model's Variables).
        // Each entry holds its type, so no address in the map can be reused meanwhile.
        let mut slots_of: HashMap<usize, (Py<PyType>, Vec<Py<PyAny>>)> = HashMap::new();
        for i in containers {
            let obj = objects.get_item(i)?;
            if obj.is_instance_of::<PyTuple>() || obj.is_none() {
                continue;
            }
            // An exact list or dict has neither a `__dict__` nor slots: no lookups (each would
            // raise and clear an AttributeError).
            if let Ok(list) = obj.cast_exact::<PyList>() {
                watched.push(Watched::List(obj.clone().unbind(), list_items(list)));
                owners.resize(watched.len(), i);
                continue;
            }
            if let Ok(dict) = obj.cast_exact::<PyDict>() {
                watched.push(Watched::Dict(obj.clone().unbind(), dict_items(dict)));
                owners.resize(watched.len(), i);
                continue;
            }
            let mut known = false;
            if let Ok(list) = obj.cast::<PyList>() {
                watched.push(Watched::List(obj.clone().unbind(), list_items(list)));
                known = true;
            } else if let Ok(dict) = obj.cast::<PyDict>() {
                watched.push(Watched::Dict(obj.clone().unbind(), dict_items(dict)));
                known = true;
            }
            if let Ok(attrs) = obj.getattr(pyo3::intern!(py, "__dict__")) {
                match attrs.cast_into::<PyDict>() {
                    Ok(attrs) => {
                        let items = dict_items(&attrs);
                        watched.push(Watched::Attributes(attrs.unbind(), items));
                        known = true;
                    }
                    Err(_) => checkable = false, // a mappingproxy or the like
                }
            }
            let ty = obj.get_type();
            let descrs = match slots_of.get(&(ty.as_ptr() as usize)) {
                Some((_, descrs)) => descrs.iter().map(|d| d.bind(py).clone()).collect(),
                None => {
                    let descrs = slot_descriptors(&ty)?;
                    let kept = descrs.iter().map(|d| d.clone().unbind()).collect();
                    slots_of.insert(ty.as_ptr() as usize, (ty.clone().unbind(), kept));
                    descrs
                }
            };
            if !descrs.is_empty() {
                watched.push(Watched::Slots(
                    obj.clone().unbind(),
                    slot_values(&obj, descrs)?,
                ));
                known = true;
            }
            if !known {
                checkable = false;
            }
            owners.resize(watched.len(), i);
        }
        Ok(Snapshot {
            watched,
            owners,
            checkable,
        })
    }

    /// The same objects watched again, with what they hold now.
    fn again(&self, py: Python<'_>) -> PyResult<Snapshot> {
        Ok(Snapshot {
            watched: self
                .watched
                .iter()
                .map(|w| w.again(py))
                .collect::<PyResult<_>>()?,
            owners: self.owners.clone(),
            checkable: self.checkable,
        })
    }

    /// Record again, in place, what the objects at these node indices hold now (those a
    /// call's write-back changed); the others keep their record. A node left out that did
    /// change only makes the next `unchanged` false: a flatten too many, never a change
    /// missed.
    fn refresh(&mut self, py: Python<'_>, nodes: Vec<usize>) -> PyResult<()> {
        let nodes: std::collections::HashSet<usize> = nodes.into_iter().collect();
        for (w, owner) in self.watched.iter_mut().zip(&self.owners) {
            if nodes.contains(owner) {
                *w = w.again(py)?;
            }
        }
        Ok(())
    }

    /// Whether every watched object still holds exactly what it held.
    fn unchanged(&self, py: Python<'_>) -> PyResult<bool> {
        for w in &self.watched {
            if !w.unchanged(py)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
