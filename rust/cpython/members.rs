//! Member descriptors as `__slots__` makes them, and the values they locate: what the snapshot
//! reads (`bound/`), the write-back sets (`writeback/slots.rs`) and nnx's flatten reads
//! (`SlotReader`) in the object itself, where the interpreter keeps a slot's value, instead of
//! calling the descriptor.

use super::layouts;
use super::{Internals, TypeVersion};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a member descriptor (`PyMemberDescr_Type`: what `__slots__` makes, and C types'
/// members) says of its member, as `layouts::member` reads it (one type for both builds of
/// `layouts`).
#[derive(Clone, Copy)]
pub struct Member {
    /// The class that defines the member: its instances store the value at `offset`.
    pub class: *mut ffi::PyTypeObject,
    pub offset: isize,
    /// A `PyObject *` read and set as is (`Py_T_OBJECT_EX`, an absolute offset, no audit hook
    /// on reads): `PyMember_GetOne` and `PyMember_SetOne` read and swap one pointer.
    pub plain_object: bool,
    pub read_only: bool,
}

/// Where the instances of one type version store one plain object member (`Py_T_OBJECT_EX` at
/// an absolute offset, no audit hook on reads): `PyMember_GetOne` and `PyMember_SetOne` read
/// and swap the pointer there, and so do `get`, `read` and `swap`, for an object of that
/// version (each checks it first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotAt {
    version: TypeVersion,
    offset: isize,
}

impl SlotAt {
    /// The pointer `obj` holds there (null: unset), None where `obj` is not of this type
    /// version. Borrowed: only compare it (it may dangle once any Python code runs).
    #[inline]
    fn get(self, obj: &Bound<'_, PyAny>) -> Option<*mut ffi::PyObject> {
        // SAFETY: `obj` is of the type version the member was found under (checked), so it
        // stores the member at `offset`.
        self.version
            .holds(obj)
            .then(|| unsafe { *layouts::slot(self.gate(), obj.as_ptr(), self.offset) })
    }

    /// Whether `obj` is of this version and holds `value` there (null: unset), by address
    /// (the snapshot's check of each slot: no reference taken).
    #[inline]
    pub fn holds(self, obj: &Bound<'_, PyAny>, value: *mut ffi::PyObject) -> bool {
        // SAFETY: as in `get`; the pointer read is only compared.
        self.version.holds(obj)
            && unsafe { *layouts::slot(self.gate(), obj.as_ptr(), self.offset) } == value
    }

    /// The value `obj` holds there (None: unset), None where `obj` is not of this version.
    pub fn read<'py>(self, obj: &Bound<'py, PyAny>) -> Option<Option<Bound<'py, PyAny>>> {
        let held = self.get(obj)?;
        // SAFETY: read just now, with no Python code run since; a reference is taken at once.
        Some(unsafe { Bound::from_borrowed_ptr_or_opt(obj.py(), held) })
    }

    /// Put `value` there and return what was there (None: unset), None (nothing done) where
    /// `obj` is not of this version.
    pub fn swap<'py>(
        self,
        obj: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
    ) -> Option<Option<Bound<'py, PyAny>>> {
        if !self.version.holds(obj) {
            return None;
        }
        // SAFETY: `obj` stores the member at `offset` (its version is checked) and the GIL is
        // held; no Python code runs between the read and the write, and the reference the
        // place held passes to the caller.
        unsafe {
            let at = layouts::slot(self.gate(), obj.as_ptr(), self.offset);
            let before = *at;
            *at = value.clone().into_ptr();
            Some(Bound::from_owned_ptr_or_opt(obj.py(), before))
        }
    }

    pub fn version(self) -> TypeVersion {
        self.version
    }

    fn gate(self) -> Internals {
        self.version.gate()
    }
}

impl Internals {
    /// The member `descr` describes, where it is a plain object member of a class `obj` is
    /// an instance of (read-only ones only where not `writable`): its offset in `obj`.
    fn instance_member(
        self,
        obj: &Bound<'_, PyAny>,
        descr: &Bound<'_, PyAny>,
        writable: bool,
    ) -> Option<isize> {
        // SAFETY: `descr` is alive (borrowed), and so is the class it names (the descriptor
        // holds it); the instance check runs no Python code.
        let member = unsafe { layouts::member(self, descr.as_ptr()) }?;
        let fits = member.plain_object
            && !(writable && member.read_only)
            && unsafe { ffi::PyObject_TypeCheck(obj.as_ptr(), member.class) } != 0;
        fits.then_some(member.offset)
    }

    /// What the member descriptor `descr` holds in `obj`, where it is a plain object member
    /// of a class `obj` is an instance of: the pointer stored (null: unset), as
    /// `PyMember_GetOne` reads it. Borrowed: only compare it.
    pub fn member_value(
        self,
        obj: &Bound<'_, PyAny>,
        descr: &Bound<'_, PyAny>,
    ) -> Option<*mut ffi::PyObject> {
        let offset = self.instance_member(obj, descr, false)?;
        // SAFETY: `obj` is an instance of the member's class (checked), which stores the
        // member at `offset`.
        Some(unsafe { *layouts::slot(self, obj.as_ptr(), offset) })
    }

    /// Where the instances of `obj`'s type version store the member `descr` describes, when
    /// it is a plain object member (writable, if asked) of a class `obj` is an instance of.
    pub fn slot_at(
        self,
        obj: &Bound<'_, PyAny>,
        descr: &Bound<'_, PyAny>,
        writable: bool,
    ) -> Option<SlotAt> {
        let version = self.type_version(obj)?;
        // Nothing runs in between: every object of this version is such an instance (its
        // MRO is the same while the version holds).
        let offset = self.instance_member(obj, descr, writable)?;
        Some(SlotAt { version, offset })
    }

    /// Where `obj` stores `name`, when the first class along the MRO of its type that defines
    /// `name` defines it as a plain object member (`slot_at`, `writable` as there).
    fn slot_named(
        self,
        obj: &Bound<'_, PyAny>,
        name: &Bound<'_, PyString>,
        writable: bool,
    ) -> Option<SlotAt> {
        let descr = self.type_lookup(&obj.get_type(), name)??;
        self.slot_at(obj, &descr, writable)
    }

    /// Where `object.__setattr__(obj, name, value)` would store the value, for the version of
    /// `obj`'s type: `Some((version, Some(slot)))` when that is a plain object slot (the type's
    /// setter is the generic one, `generic_setattr_applies`, and `slot_named` finds a
    /// writable member), `Some((version, None))` when it is not, None where the type has no
    /// version or changed meanwhile.
    pub fn setattr_place(
        self,
        obj: &Bound<'_, PyAny>,
        name: &Bound<'_, PyString>,
    ) -> PyResult<Option<(TypeVersion, Option<SlotAt>)>> {
        let found = self.for_type_version(obj, || -> PyResult<Option<SlotAt>> {
            if !self.generic_setattr_applies(obj)? {
                return Ok(None);
            }
            Ok(self.slot_named(obj, name, true))
        });
        let Some((version, slot)) = found else {
            return Ok(None);
        };
        // A slot found under another version (the class changed during the search) is none.
        Ok(Some((version, slot?.filter(|s| s.version == version))))
    }

    /// Where `getattr(obj, name)` reads a plain object slot: the type's `tp_getattro` is the
    /// generic one, or a Python class's `__getattr__` hook whose `__getattribute__` along the
    /// MRO is `object`'s (the hook then calls the generic one first), and the name is such a
    /// slot (`slot_named`: found first along the MRO, a data descriptor comes before any
    /// instance dict).
    fn getattr_slot(self, obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Option<SlotAt> {
        let py = obj.py();
        let ty = obj.get_type();
        let getattro = self.getattro(&ty);
        if getattro != ffi::PyObject_GenericGetAttr as *const () as usize {
            let python = self.python_slots(py).ok()?;
            let found = self.type_lookup(&ty, intern!(py, "__getattribute__"))??;
            if getattro != python.getattro || !found.is(&python.object_getattribute) {
                return None;
            }
        }
        self.slot_named(obj, name, false)
    }
}

/// Reads one attribute as `getattr` does, from where the instance stores it when that is a
/// slot: a flatten reads `_raw_value` from every nnx `Variable`, whose class defines
/// `__getattr__`, so `getattr` looks up `__getattr__`, `__getattribute__` and the name along
/// the MRO and calls the member descriptor, about 300 instructions for a pointer read. The
/// place is found once per type version (the last one read is kept: a reader serves one
/// registered type). Without `Internals`, `getattr` itself.
pub struct SlotReader {
    /// The version tag (high half) and the offset (low half, `NOT_A_SLOT` where `getattr`
    /// must run) last found; 0: none yet. (A tag names one version of one type.)
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
        let read = super::internals().and_then(|gate| self.read(gate, obj, name));
        match read {
            Some(value) => Ok(value),
            None => obj.getattr(name),
        }
    }

    /// The slot's value where `getattr` would return it (None: `getattr` must run, as it must
    /// when the slot is unset, for `__getattr__`).
    fn read<'py>(
        &self,
        gate: Internals,
        obj: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
    ) -> Option<Bound<'py, PyAny>> {
        let tag = gate.type_tag(obj)?.get();
        let place = self.place.load(Ordering::Relaxed);
        let offset = if (place >> 32) as u32 == tag {
            place as u32
        } else {
            let (version, slot) = gate.for_type_version(obj, || gate.getattr_slot(obj, name))?;
            let offset = (slot.filter(|s| s.version == version))
                .and_then(|s| u32::try_from(s.offset).ok())
                .unwrap_or(NOT_A_SLOT);
            let tag = version.tag();
            self.place
                .store(u64::from(tag) << 32 | u64::from(offset), Ordering::Relaxed);
            offset
        };
        if offset == NOT_A_SLOT {
            return None;
        }
        // SAFETY: under this type version (its tag is the one just read off `obj`'s type)
        // `getattr(obj, name)` reads an object member at `offset` of a class `obj` is an
        // instance of (`getattr_slot`); the value is made a reference at once.
        unsafe {
            let at = layouts::slot(gate, obj.as_ptr(), offset as isize);
            Bound::from_borrowed_ptr_or_opt(obj.py(), *at)
        }
    }
}

#[cfg(all(test, cpython_layouts))]
mod tests {
    use super::super::tests::{gate, run};
    use super::*;

    const CODE: &str = "
class Slotted:
    __slots__ = ('a', 'b', '__private')
class Hooked(Slotted):
    __slots__ = ('c',)
    def __getattr__(self, name): return ('hook', name)
class Prop:
    __slots__ = ('_x',)
    x = property(lambda self: self._x)
class Dicty:
    def __init__(self): self.a = 'in the dict'
h = Hooked(); h.a = [1]; h.c = [3]   # h.b unset
s = Slotted(); s.a = [0]; s._Slotted__private = [7]
p = Prop(); p._x = [5]
d = Dicty()
";

    fn obj<'py>(py: Python<'py>, name: &str) -> Bound<'py, PyAny> {
        run(py, CODE, name)
    }

    #[test]
    fn a_members_place_holds_what_its_descriptor_reads() {
        Python::attach(|py| {
            let gate = gate(py);
            for (name, attr) in [
                ("h", "a"),
                ("h", "b"),
                ("h", "c"),
                ("s", "_Slotted__private"),
            ] {
                let o = obj(py, name);
                let descr = gate
                    .type_lookup(&o.get_type(), &PyString::new(py, attr))
                    .unwrap()
                    .unwrap();
                let public = descr.call_method1("__get__", (&o, o.get_type())).ok();
                let held = gate
                    .member_value(&o, &descr)
                    .expect("a plain object member");
                assert_eq!(
                    held,
                    public.as_ref().map_or(std::ptr::null_mut(), |v| v.as_ptr())
                );
                let at = gate.slot_at(&o, &descr, true).unwrap();
                assert!(at.holds(&o, held) && at.get(&o) == Some(held));
                let member = unsafe { layouts::member(gate, descr.as_ptr()) }.unwrap();
                assert!(
                    member.class.cast::<ffi::PyObject>()
                        == descr.getattr("__objclass__").unwrap().as_ptr()
                );
                // Swapped in place, the descriptor reads the new value; swapped back, the old.
                let new = PyString::new(py, "new").into_any();
                let before = at.swap(&o, &new).unwrap();
                assert!(o.getattr(attr).unwrap().is(&new));
                let back = before.unwrap_or_else(|| new.clone());
                at.swap(&o, &back).unwrap();
            }
        });
    }

    #[test]
    fn only_plain_object_members_of_the_objects_class_have_a_place() {
        Python::attach(|py| {
            let gate = gate(py);
            let s = obj(py, "s");
            let d = obj(py, "d");
            let descr = s.get_type().getattr("a").unwrap();
            // Another class's object: no place (`PyMember_GetOne` would refuse it too).
            assert!(gate.member_value(&d, &descr).is_none());
            assert!(descr.call_method1("__get__", (&d, d.get_type())).is_err());
            // A property, a function, a C type's read-only or non-object member: none.
            let prop = obj(py, "Prop").getattr("x").unwrap();
            assert!(gate.member_value(&obj(py, "p"), &prop).is_none());
            let real = py.eval(c"complex.real", None, None).unwrap();
            let one = py.eval(c"1j", None, None).unwrap();
            assert!(gate.member_value(&one, &real).is_none());
            let start = py.eval(c"slice.start", None, None).unwrap();
            let slice = py.eval(c"slice(1, 2)", None, None).unwrap();
            assert!(gate.slot_at(&slice, &start, true).is_none());
            // A changed class: the place found before no longer applies.
            let at = gate.slot_at(&s, &descr, false).unwrap();
            s.get_type().setattr("other", 1).unwrap();
            assert!(at.get(&s).is_none() && at.read(&s).is_none());
            assert!(!at.holds(&s, std::ptr::null_mut()));
            assert!(at.swap(&s, &s).is_none());
        });
    }

    #[test]
    fn the_slot_reader_reads_what_getattr_returns() {
        Python::attach(|py| {
            let reader = SlotReader::new();
            let _ = gate(py);
            for (name, attr) in [
                ("h", "a"),
                ("h", "b"),
                ("h", "c"),
                ("h", "zzz"),
                ("s", "a"),
                ("p", "x"),
                ("d", "a"),
            ] {
                let o = obj(py, name);
                let attr = PyString::new(py, attr);
                for _ in 0..2 {
                    let ours = reader.getattr(&o, &attr);
                    let public = o.getattr(&attr);
                    match (ours, public) {
                        (Ok(a), Ok(b)) => assert!(a.eq(&b).unwrap(), "{name}.{attr}"),
                        (Err(a), Err(b)) => assert!(a.get_type(py).is(b.get_type(py))),
                        (a, b) => panic!("{name}.{attr}: {a:?} against {b:?}"),
                    }
                }
            }
        });
    }

    #[test]
    fn setattr_places_are_slots_where_object_setattr_stores_in_one() {
        Python::attach(|py| {
            let gate = gate(py);
            let a = PyString::new(py, "a");
            for (name, slot) in [("h", true), ("s", true), ("p", false), ("d", false)] {
                let o = obj(py, name);
                let (version, at) = gate.setattr_place(&o, &a).unwrap().unwrap();
                assert!(version.holds(&o));
                assert_eq!(at.is_some(), slot, "{name}");
                if let Some(at) = at {
                    let new = PyString::new(py, "set").into_any();
                    at.swap(&o, &new).unwrap();
                    let public = py
                        .get_type::<PyAny>()
                        .call_method1("__getattribute__", (&o, &a));
                    assert!(public.unwrap().is(&new));
                }
            }
        });
    }
}
