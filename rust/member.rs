//! Member descriptors as `__slots__` makes them: what the snapshot reads (`bound/`), the
//! write-back sets (`writeback/slots.rs`) and nnx's flatten reads (`SlotReader`) in the
//! object itself, where the interpreter keeps a slot's value, instead of calling the
//! descriptor.

use pyo3::exceptions::{PyKeyError, PyTypeError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use std::sync::atomic::{AtomicU64, Ordering};

/// `descr` as a member descriptor, if it is one.
///
/// # Safety
/// `descr` must point to a live object, which must outlive the reference returned.
pub unsafe fn member_descr<'a>(descr: *mut ffi::PyObject) -> Option<&'a ffi::PyMemberDescrObject> {
    unsafe {
        (ffi::Py_TYPE(descr) == std::ptr::addr_of_mut!(ffi::PyMemberDescr_Type))
            .then(|| &*descr.cast::<ffi::PyMemberDescrObject>())
    }
}

/// Where an instance stores the value of `descr`, with the class that defines it, when `descr`
/// is a plain object member (`Py_T_OBJECT_EX` at an absolute offset, no audit hook on reads;
/// not read-only where `writable` is asked): there `PyMember_GetOne` and `PyMember_SetOne`
/// read and swap one pointer, once the object is checked to be an instance of that class.
///
/// # Safety
/// `descr` must point to a live object.
pub unsafe fn object_member(
    descr: *mut ffi::PyObject,
    writable: bool,
) -> Option<(isize, *mut ffi::PyTypeObject)> {
    let descr = unsafe { member_descr(descr)? };
    let member = unsafe { descr.d_member.as_ref()? };
    let mut refused = ffi::Py_AUDIT_READ | ffi::Py_RELATIVE_OFFSET;
    if writable {
        refused |= ffi::Py_READONLY;
    }
    (member.type_code == ffi::Py_T_OBJECT_EX && member.flags & refused == 0)
        .then_some((member.offset, descr.d_common.d_type))
}

/// Where `obj` stores the value of `descr`, when `descr` is a plain object member
/// (`object_member`) of a class `obj` is an instance of.
///
/// # Safety
/// `obj` and `descr` must point to live objects.
pub unsafe fn instance_member(
    obj: *mut ffi::PyObject,
    descr: *mut ffi::PyObject,
    writable: bool,
) -> Option<isize> {
    unsafe {
        object_member(descr, writable)
            .filter(|&(_, class)| ffi::PyObject_TypeCheck(obj, class) != 0)
            .map(|(offset, _)| offset)
    }
}

/// The place of a slot's value in `obj`: the `PyObject *` (NULL: unset) at `offset`.
///
/// # Safety
/// `offset` must be where `obj`'s type stores an object member (`instance_member`, or an offset
/// found under the type version `obj`'s type still has). What the place holds is borrowed and
/// may dangle once any Python code runs: only compare it, swap it, or take a reference at once.
pub unsafe fn slot_ptr(obj: *mut ffi::PyObject, offset: isize) -> *mut *mut ffi::PyObject {
    unsafe { obj.cast::<u8>().offset(offset).cast::<*mut ffi::PyObject>() }
}

/// What `_PyType_Lookup(ty, name)` finds (CPython does not export it): the value `name` has in
/// the namespace of the first class along `ty`'s MRO that defines it, `Some(None)` when none
/// does. None where that cannot be told without running Python code (an MRO that is not a
/// tuple of types, a namespace that raises).
pub fn type_lookup<'py>(
    ty: &Bound<'py, PyType>,
    name: &Bound<'py, PyString>,
) -> Option<Option<Bound<'py, PyAny>>> {
    let py = ty.py();
    // The MRO and namespaces `_PyType_Lookup` reads: the type's own, past any metaclass.
    // SAFETY: the type is alive (held), so is its MRO tuple, taken a reference to at once.
    let mro = unsafe { Bound::from_borrowed_ptr_or_opt(py, (*ty.as_type_ptr()).tp_mro)? };
    for class in mro.cast_into::<PyTuple>().ok()?.iter() {
        let class = class.cast_into::<PyType>().ok()?;
        // SAFETY: `class` is alive (held); `tp_dict` is NULL only for static built-in types
        // from 3.12 on, whose namespace `__dict__` then gives.
        let dict = unsafe { (*class.as_type_ptr()).tp_dict };
        let namespace = if dict.is_null() {
            class.getattr(intern!(py, "__dict__")).ok()?
        } else {
            unsafe { Bound::from_borrowed_ptr(py, dict) }
        };
        match namespace.get_item(name) {
            Ok(value) => return Some(Some(value)),
            Err(e) if e.is_instance_of::<PyKeyError>(py) => continue,
            Err(_) => return None,
        }
    }
    Some(None)
}

/// The offset at which instances of `obj`'s type store `name`, where the first class along
/// the MRO that defines it defines it as a plain object member (`object_member`, `writable`
/// as there) and `obj` is an instance of that class.
pub fn slot_offset(
    obj: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    writable: bool,
) -> Option<isize> {
    let descr = type_lookup(&obj.get_type(), name)??;
    // SAFETY: `descr` is alive (held) while it is read; `obj` is alive.
    unsafe { instance_member(obj.as_ptr(), descr.as_ptr(), writable) }
}

/// `find()` for the version of `obj`'s type: its tag with what was found, or None where the
/// type has no valid tag or changed while `find` ran (it may run Python code, which can change
/// the class, or give `obj` another and let this one go: the type is held meanwhile). What
/// was found about a type version stays right while the type has that tag.
pub fn for_type_version<T>(obj: &Bound<'_, PyAny>, find: impl FnOnce() -> T) -> Option<(u32, T)> {
    let held = obj.get_type();
    let ty = held.as_type_ptr();
    // SAFETY: `ty` is alive (held) at both reads.
    let tag = unsafe { version_tag(ty) }?;
    let found = find();
    unsafe { has_type_version(obj, ty, tag) }.then_some((tag, found))
}

/// Whether `obj` is of the type `ty`, which has the version `tag`.
///
/// # Safety
/// `ty` must point to a live type object.
pub unsafe fn has_type_version(
    obj: &Bound<'_, PyAny>,
    ty: *mut ffi::PyTypeObject,
    tag: u32,
) -> bool {
    obj.get_type_ptr() == ty && unsafe { version_tag(ty) } == Some(tag)
}

/// The address of a type's `tp_getattro` (0: none).
///
/// # Safety
/// `ty` must point to a live type object.
pub unsafe fn getattro_of(ty: *mut ffi::PyTypeObject) -> usize {
    unsafe { (*ty).tp_getattro }.map_or(0, |f| f as usize)
}

/// The address of a type's `tp_setattro` (0: none).
///
/// # Safety
/// `ty` must point to a live type object.
pub unsafe fn setattro_of(ty: *mut ffi::PyTypeObject) -> usize {
    unsafe { (*ty).tp_setattro }.map_or(0, |f| f as usize)
}

/// The type's version tag, None when it has no valid one (0; before 3.13 the flag
/// `Py_TPFLAGS_VALID_VERSION_TAG` says so too, and is cleared with it). CPython renews it
/// whenever the type or one of its bases changes (an attribute set or deleted on the class,
/// `__bases__` assigned) and never gives one to two type versions, so what was found about a
/// type under a tag holds while the type has that tag.
///
/// # Safety
/// `ty` must point to a live type object.
pub unsafe fn version_tag(ty: *mut ffi::PyTypeObject) -> Option<u32> {
    let (tag, _flags) = unsafe { ((*ty).tp_version_tag, (*ty).tp_flags) };
    #[cfg(not(Py_3_13))]
    if _flags & ffi::Py_TPFLAGS_VALID_VERSION_TAG == 0 {
        return None;
    }
    (tag != 0).then_some(tag)
}

/// Reads one attribute as `getattr` does, from where the instance stores it when that is a
/// slot: a flatten reads `_raw_value` from every nnx `Variable`, whose class defines
/// `__getattr__`, so `getattr` looks up `__getattr__`, `__getattribute__` and the name along
/// the MRO and calls the member descriptor, about 300 instructions for a pointer read. The
/// place is found once per type version (the last one read is kept: a reader serves one
/// registered type).
pub struct SlotReader {
    /// The version tag (high half) and the offset (low half, `NOT_A_SLOT` where `getattr`
    /// must run) last found; 0: none yet.
    place: AtomicU64,
}

const NOT_A_SLOT: u32 = u32::MAX;

impl SlotReader {
    pub const fn new() -> Self {
        SlotReader {
            place: AtomicU64::new(0),
        }
    }

    /// `getattr(obj, name)`; `name` must be the same string at every call.
    pub fn getattr<'py>(
        &self,
        obj: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.read(obj, name) {
            Some(value) => Ok(value),
            None => obj.getattr(name),
        }
    }

    /// The slot's value where `getattr` would return it (None: `getattr` must run, as it must
    /// when the slot is unset, for `__getattr__`).
    fn read<'py>(
        &self,
        obj: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
    ) -> Option<Bound<'py, PyAny>> {
        let ty = obj.get_type_ptr();
        // SAFETY: `obj` is alive, so is its type.
        let tag = unsafe { version_tag(ty) }?;
        let place = self.place.load(Ordering::Relaxed);
        let offset = if (place >> 32) as u32 == tag {
            place as u32
        } else {
            let (tag, offset) = for_type_version(obj, || {
                find_readable(obj, name)
                    .and_then(|offset| u32::try_from(offset).ok())
                    .unwrap_or(NOT_A_SLOT)
            })?;
            self.place
                .store(u64::from(tag) << 32 | u64::from(offset), Ordering::Relaxed);
            offset
        };
        if offset == NOT_A_SLOT {
            return None;
        }
        // SAFETY: under this type version `getattr(obj, name)` reads an object member at
        // `offset` of a class `obj` is an instance of (`find_readable`); the value is made a
        // reference at once.
        unsafe {
            let at = slot_ptr(obj.as_ptr(), offset as isize);
            Bound::from_borrowed_ptr_or_opt(obj.py(), *at)
        }
    }
}

/// Where `getattr(obj, name)` reads a plain object slot: the type's `tp_getattro` is the
/// generic one, or a Python class's `__getattr__` hook whose `__getattribute__` along the MRO
/// is `object`'s (the hook then calls the generic one first), and the name is such a slot
/// (`slot_offset`; found first along the MRO, a data descriptor comes before any instance
/// dict).
fn find_readable(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Option<isize> {
    let py = obj.py();
    let ty = obj.get_type();
    // SAFETY: `ty` is alive (held).
    let getattro = unsafe { getattro_of(ty.as_type_ptr()) };
    if getattro != ffi::PyObject_GenericGetAttr as *const () as usize {
        let python = python_slots(py).ok()?;
        let found = type_lookup(&ty, intern!(py, "__getattribute__"))??;
        if getattro != python.getattro || !found.is(&python.object_getattribute) {
            return None;
        }
    }
    slot_offset(obj, name, false)
}

/// What CPython gives the instances of a Python class for attribute access and does not
/// export: the `tp_getattro` of a class that defines `__getattr__` (`slot_tp_getattr_hook`)
/// and the `tp_setattro` of one that defines `__setattr__` (`slot_tp_setattro`), read off one
/// such class made once; and `object.__getattribute__`.
pub struct PythonSlots {
    pub getattro: usize,
    pub setattro: usize,
    pub object_getattribute: Py<PyAny>,
}

/// The probe class's answers (found at the first call).
pub fn python_slots(py: Python<'_>) -> PyResult<&PythonSlots> {
    static SLOTS: PyOnceLock<PythonSlots> = PyOnceLock::new();
    SLOTS.get_or_try_init(py, || {
        let namespace = PyDict::new(py);
        py.run(
            // (Indented by one space: the line breaks of the literal drop what follows them.)
            c"class Hooked:\n \
              def __getattr__(self, name): raise AttributeError(name)\n \
              def __setattr__(self, name, value): pass\n",
            None,
            Some(&namespace),
        )?;
        let class = namespace
            .get_item("Hooked")?
            .ok_or_else(|| PyTypeError::new_err("the probe class was not made"))?
            .cast_into::<PyType>()?;
        // SAFETY: `class` is alive (held above).
        let (getattro, setattro) = unsafe {
            let ty = class.as_type_ptr();
            (getattro_of(ty), setattro_of(ty))
        };
        let object = py.get_type::<PyAny>();
        let object_getattribute = object.getattr("__dict__")?.get_item("__getattribute__")?;
        Ok(PythonSlots {
            getattro,
            setattro,
            object_getattribute: object_getattribute.unbind(),
        })
    })
}
