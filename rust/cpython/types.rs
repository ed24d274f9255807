//! Type objects: versions, attribute hooks, bases, and the lookup along the MRO.

use super::layouts;
use super::Internals;
use pyo3::exceptions::{PyKeyError, PyTypeError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use std::num::NonZeroU32;

/// One version of one type: while an object is of the type at this address and the type has
/// this tag (`layouts::type_version_tag`), the class's namespaces and MRO are as they were.
/// A tag names one version of one type for the life of the process, so the pair does too,
/// whether or not the type is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeVersion {
    ty: usize,
    tag: NonZeroU32,
    gate: Internals,
}

impl TypeVersion {
    /// Whether `obj` is of this type, which still has this version.
    #[inline]
    pub fn holds(self, obj: &Bound<'_, PyAny>) -> bool {
        obj.get_type_ptr() as usize == self.ty && self.gate.type_tag(obj) == Some(self.tag)
    }

    pub fn tag(self) -> u32 {
        self.tag.get()
    }

    pub(super) fn gate(self) -> Internals {
        self.gate
    }
}

impl Internals {
    /// The version tag of `obj`'s type, None where it has none (CPython gives one at a lookup
    /// on the type, and stops giving a class new ones after many changes to it).
    #[inline]
    pub fn type_tag(self, obj: &Bound<'_, PyAny>) -> Option<NonZeroU32> {
        // SAFETY: `obj` is alive, so is its type.
        unsafe { layouts::type_version_tag(self, obj.get_type_ptr()) }
    }

    /// The version `ty` has now.
    pub fn version_of(self, ty: &Bound<'_, PyType>) -> Option<TypeVersion> {
        // SAFETY: `ty` is alive (borrowed).
        let tag = unsafe { layouts::type_version_tag(self, ty.as_type_ptr()) }?;
        Some(TypeVersion {
            ty: ty.as_ptr() as usize,
            tag,
            gate: self,
        })
    }

    /// The version `obj`'s type has now.
    #[inline]
    pub fn type_version(self, obj: &Bound<'_, PyAny>) -> Option<TypeVersion> {
        Some(TypeVersion {
            ty: obj.get_type_ptr() as usize,
            tag: self.type_tag(obj)?,
            gate: self,
        })
    }

    /// `find()` for the version of `obj`'s type: that version with what was found, or None
    /// where the type has no version or changed while `find` ran (it may run Python code,
    /// which can change the class, or give `obj` another and let this one go: the type is
    /// held meanwhile). What was found about a type version stays right while it holds.
    pub fn for_type_version<T>(
        self,
        obj: &Bound<'_, PyAny>,
        find: impl FnOnce() -> T,
    ) -> Option<(TypeVersion, T)> {
        let held = obj.get_type();
        let version = self.version_of(&held)?;
        let found = find();
        version.holds(obj).then_some((version, found))
    }

    /// The address of `ty`'s `tp_getattro` (0: none).
    pub fn getattro(self, ty: &Bound<'_, PyType>) -> usize {
        // SAFETY: `ty` is alive (borrowed).
        unsafe { layouts::getattro(self, ty.as_type_ptr()) }
    }

    /// The address of `ty`'s `tp_setattro` (0: none).
    pub fn setattro(self, ty: &Bound<'_, PyType>) -> usize {
        // SAFETY: `ty` is alive (borrowed).
        unsafe { layouts::setattro(self, ty.as_type_ptr()) }
    }

    /// Whether CPython's check in `object.__setattr__` (its `hackcheck`: it must not skip a
    /// C-level `__setattr__`) passes for `obj`, making the call the same as
    /// `PyObject_GenericSetAttr`: going up the bases from `obj`'s type, the first whose
    /// `tp_setattro` is not a Python class's (`python_slots`) must be object's. Any other
    /// C-level one, or none found, answers false.
    pub fn generic_setattr_applies(self, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
        let python = self.python_slots(obj.py())?.setattro;
        let generic = ffi::PyObject_GenericSetAttr as *const () as usize;
        let mut ty = obj.get_type_ptr();
        while !ty.is_null() {
            // SAFETY: `obj` is alive, so are its type and that type's bases (each holds its
            // base); no Python code runs in this loop.
            match unsafe { layouts::setattro(self, ty) } {
                f if f == generic => return Ok(true),
                f if f == python && python != 0 => ty = unsafe { layouts::base(self, ty) },
                _ => return Ok(false),
            }
        }
        Ok(false)
    }

    /// What `_PyType_Lookup(ty, name)` finds (CPython does not export it): the value `name`
    /// has in the namespace of the first class along `ty`'s MRO that defines it, `Some(None)`
    /// when none does. None where that cannot be told without running Python code (an MRO
    /// that is not a tuple of types, a namespace that raises).
    pub fn type_lookup<'py>(
        self,
        ty: &Bound<'py, PyType>,
        name: &Bound<'py, PyString>,
    ) -> Option<Option<Bound<'py, PyAny>>> {
        let py = ty.py();
        // The MRO and namespaces `_PyType_Lookup` reads: the type's own, past any metaclass.
        // SAFETY: the type is alive (borrowed), so is its MRO tuple, taken a reference to at
        // once.
        let mro =
            unsafe { Bound::from_borrowed_ptr_or_opt(py, layouts::mro(self, ty.as_type_ptr()))? };
        for class in mro.cast_into::<PyTuple>().ok()?.iter() {
            let class = class.cast_into::<PyType>().ok()?;
            // SAFETY: `class` is alive (held); a reference is taken to its namespace at once.
            let dict = unsafe { layouts::type_dict(self, class.as_type_ptr()) };
            let namespace = if dict.is_null() {
                // A static built-in type from 3.12 on: `__dict__` gives its namespace.
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

    /// The probe class's answers (found at the first call).
    pub fn python_slots(self, py: Python<'_>) -> PyResult<&'static PythonSlots> {
        static SLOTS: PyOnceLock<PythonSlots> = PyOnceLock::new();
        SLOTS.get_or_try_init(py, || {
            let namespace = PyDict::new(py);
            py.run(
                // (Indented by one space: the line breaks of the literal drop what follows.)
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
            let object = py.get_type::<PyAny>();
            let object_getattribute = object.getattr("__dict__")?.get_item("__getattribute__")?;
            Ok(PythonSlots {
                getattro: self.getattro(&class),
                setattro: self.setattro(&class),
                object_getattribute: object_getattribute.unbind(),
            })
        })
    }
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

#[cfg(all(test, cpython_layouts))]
mod tests {
    use super::super::tests::{gate, run};
    use super::*;

    /// `PyType_GetSlot(ty, slot)` as an address (the public API's answer; all types from 3.10).
    fn public_slot(ty: &Bound<'_, PyType>, slot: std::os::raw::c_int) -> usize {
        unsafe { ffi::PyType_GetSlot(ty.as_type_ptr(), slot) as usize }
    }

    const CLASSES: &str = "
import types
class Plain: pass
class Hooked:
    def __getattr__(self, name): raise AttributeError(name)
class Setter:
    def __setattr__(self, name, value): object.__setattr__(self, name, value)
class Slotted:
    __slots__ = ('a', 'b')
class Sub(Slotted, Setter):
    __slots__ = ('c',)
class Meta(type): pass
class WithMeta(metaclass=Meta): pass
class Dict(dict): pass
classes = [object, int, dict, type, Plain, Hooked, Setter, Slotted, Sub, Meta, WithMeta, Dict,
           types.SimpleNamespace, types.ModuleType]
";

    fn classes(py: Python<'_>) -> Vec<Bound<'_, PyType>> {
        run(py, CLASSES, "classes")
            .try_iter()
            .unwrap()
            .map(|c| c.unwrap().cast_into::<PyType>().unwrap())
            .collect()
    }

    #[test]
    fn getattro_setattro_and_base_are_what_the_public_api_says() {
        Python::attach(|py| {
            let gate = gate(py);
            for ty in classes(py) {
                assert_eq!(
                    gate.getattro(&ty),
                    public_slot(&ty, ffi::Py_tp_getattro),
                    "{ty}"
                );
                assert_eq!(
                    gate.setattro(&ty),
                    public_slot(&ty, ffi::Py_tp_setattro),
                    "{ty}"
                );
                let base = unsafe { layouts::base(gate, ty.as_type_ptr()) };
                let public = ty.getattr("__base__").unwrap();
                let public = if public.is_none() {
                    std::ptr::null_mut()
                } else {
                    public.as_ptr()
                };
                assert_eq!(base.cast::<ffi::PyObject>(), public, "{ty}");
                let mro = unsafe { layouts::mro(gate, ty.as_type_ptr()) };
                assert_eq!(mro, ty.getattr("__mro__").unwrap().as_ptr(), "{ty}");
            }
        });
    }

    #[test]
    fn a_types_namespace_is_the_one_its_dict_shows() {
        Python::attach(|py| {
            let gate = gate(py);
            for ty in classes(py) {
                let dict = unsafe { layouts::type_dict(gate, ty.as_type_ptr()) };
                let public = ty.getattr("__dict__").unwrap();
                if dict.is_null() {
                    // Only the static built-in types, from 3.12 on, keep it elsewhere.
                    let flags = unsafe { ffi::PyType_GetFlags(ty.as_type_ptr()) };
                    assert!(
                        cfg!(Py_3_12) && flags & ffi::Py_TPFLAGS_HEAPTYPE == 0,
                        "{ty}"
                    );
                    continue;
                }
                let dict = unsafe { Bound::from_borrowed_ptr(py, dict) };
                assert_eq!(dict.len().unwrap(), public.len().unwrap(), "{ty}");
                for key in public.try_iter().unwrap() {
                    let key = key.unwrap();
                    assert!(dict
                        .get_item(&key)
                        .unwrap()
                        .is(public.get_item(&key).unwrap()));
                }
            }
        });
    }

    #[test]
    fn the_lookup_finds_what_the_mro_and_the_namespaces_give() {
        Python::attach(|py| {
            let gate = gate(py);
            let names = [
                "__init__",
                "__getattr__",
                "__setattr__",
                "a",
                "c",
                "keys",
                "missing",
            ];
            for ty in classes(py) {
                for name in names {
                    let name = PyString::new(py, name);
                    let mut public = None;
                    for class in ty.getattr("__mro__").unwrap().try_iter().unwrap() {
                        let namespace = class.unwrap().getattr("__dict__").unwrap();
                        if let Ok(value) = namespace.get_item(&name) {
                            public = Some(value);
                            break;
                        }
                    }
                    let found = gate.type_lookup(&ty, &name).expect("a plain MRO");
                    match (found, public) {
                        (Some(a), Some(b)) => assert!(a.is(&b), "{ty}.{name}"),
                        (None, None) => {}
                        (a, b) => panic!("{ty}.{name}: {a:?} against {b:?}"),
                    }
                }
            }
        });
    }

    #[test]
    fn a_version_names_one_state_of_one_class() {
        Python::attach(|py| {
            let gate = gate(py);
            let code = "
class A: pass
class B: pass
A.__init__; B.__init__  # a lookup gives each a version
a, b = A(), B()
";
            let a = run(py, code, "a");
            let b = run(py, code, "b");
            let (va, vb) = (
                gate.type_version(&a).unwrap(),
                gate.type_version(&b).unwrap(),
            );
            assert_ne!(va.tag(), vb.tag());
            assert!(va.holds(&a) && !va.holds(&b));
            assert_eq!(gate.version_of(&a.get_type()), Some(va));
            // Reading the class keeps its version; changing it does not.
            let _ = a.get_type().getattr("__init__").unwrap();
            assert!(va.holds(&a));
            a.get_type().setattr("x", 1).unwrap();
            assert!(!va.holds(&a));
            // Before 3.13 a tag is valid exactly when the public flags say so.
            for ty in classes(py) {
                let flags = unsafe { ffi::PyType_GetFlags(ty.as_type_ptr()) };
                let valid = flags & ffi::Py_TPFLAGS_VALID_VERSION_TAG != 0;
                let tag = gate.version_of(&ty);
                if !cfg!(Py_3_13) {
                    assert_eq!(tag.is_some(), valid, "{ty}");
                }
            }
        });
    }

    #[test]
    fn the_probe_class_gives_what_every_python_class_with_the_hooks_gets() {
        Python::attach(|py| {
            let gate = gate(py);
            let slots = gate.python_slots(py).unwrap();
            let hooked = run(py, CLASSES, "Hooked").cast_into::<PyType>().unwrap();
            let setter = run(py, CLASSES, "Setter").cast_into::<PyType>().unwrap();
            assert_eq!(slots.getattro, public_slot(&hooked, ffi::Py_tp_getattro));
            assert_eq!(slots.setattro, public_slot(&setter, ffi::Py_tp_setattro));
            assert_ne!(
                slots.getattro,
                ffi::PyObject_GenericGetAttr as *const () as usize
            );
            assert_ne!(
                slots.setattro,
                ffi::PyObject_GenericSetAttr as *const () as usize
            );
            let object = py.get_type::<PyAny>().getattr("__getattribute__").unwrap();
            assert!(slots.object_getattribute.bind(py).is(&object));
        });
    }

    #[test]
    fn generic_setattr_applies_where_object_setattr_accepts_the_object() {
        Python::attach(|py| {
            let gate = gate(py);
            let setattr = py.get_type::<PyAny>().getattr("__setattr__").unwrap();
            let instances = run(
                py,
                &format!(
                    "{CLASSES}\ninstances = [object(), 1, {{}}, Plain(), Hooked(), \
                          Setter(), Slotted(), Sub(), WithMeta, Dict(), \
                          types.SimpleNamespace(), types.ModuleType('m'), Plain]"
                ),
                "instances",
            );
            for obj in instances.try_iter().unwrap() {
                let obj = obj.unwrap();
                // `object.__setattr__` refuses with this TypeError exactly when its check fails.
                let refused = match setattr.call1((&obj, "a", 1)) {
                    Err(e) if e.is_instance_of::<PyTypeError>(py) => {
                        e.to_string().contains("can't apply this __setattr__")
                    }
                    _ => false,
                };
                assert_eq!(
                    gate.generic_setattr_applies(&obj).unwrap(),
                    !refused,
                    "{obj}"
                );
            }
        });
    }
}
