//! One watched object and what it held (`Watched`), the type version it was recorded under
//! (`Layout`), and how each watch follows a write-back and is checked.

use super::follow::{follow_value, Followed, LeafIndex};
use super::items::{same_items, same_list, stored_dict, DictItems};
use super::reflatten::Reflatten;
use super::slots::SlotValue;
use crate::cpython::{Internals, TypeVersion};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};

/// One watched object and what it held.
pub(super) enum Watched {
    /// A list, its items, and which of them are bound leaves.
    List(Py<PyAny>, Vec<Py<PyAny>>, Followed),
    Dict(Py<PyAny>, DictItems),
    /// A set's items, in iteration order.
    Set(Py<PyAny>, Vec<Py<PyAny>>),
    /// A dict subclass's keys in iteration order: an `OrderedDict` keeps its order outside
    /// the items `Dict` compares.
    Order(Py<PyAny>, Vec<Py<PyAny>>),
    /// An object's type and its version (`obj.__class__ = Other`, or a change to the class or
    /// a base, can change its flatten).
    Type(Py<PyAny>, Layout),
    /// An object, its `__dict__` and that dict's items, and the plain containers those hold.
    Attributes(Py<PyAny>, Py<PyDict>, DictItems, Vec<Watched>),
    /// An object, the type version its slots were read under (`Layout`; it also stands for
    /// the object's `Type` watch), its slots, and the plain containers those hold.
    Slots(Py<PyAny>, Layout, Vec<SlotValue>, Vec<Watched>),
    /// A registered node whose flatten may read more than is watched: flattened again at
    /// each check (`reflatten`), before the other watches are compared.
    Flatten(Reflatten),
}

/// The type version an object was recorded under: while the object is of this very type
/// (held, so that its address cannot be reused) and the type has this version
/// (`cpython::TypeVersion`, renewed at any change of the class or a base), the class's
/// namespaces and MRO are as they were, so a flatten reading the class reads what it read,
/// and the slots' descriptors are still what the names resolve to and their places still
/// where the object stores the values.
pub(super) struct Layout {
    pub(super) ty: Py<PyType>,
    pub(super) version: TypeVersion,
}

impl Layout {
    /// The version of `obj`'s type now; None where the type has none (CPython gives a tag at
    /// a lookup on the type and stops giving a class new ones after many changes to it).
    pub(super) fn of(gate: Internals, obj: &Bound<'_, PyAny>) -> Option<Layout> {
        let ty = obj.get_type();
        let version = gate.version_of(&ty).or_else(|| {
            // A lookup on the type (`type.__getattribute__` looks `__init__` up in the type
            // itself, past the metaclass's non-data one) gives it a tag if it can have one;
            // what the lookup finds, or an error it raises, does not matter.
            let _ = ty.getattr(pyo3::intern!(ty.py(), "__init__"));
            gate.version_of(&ty)
        })?;
        Some(Layout {
            ty: ty.unbind(),
            version,
        })
    }

    pub(super) fn clone_ref(&self, py: Python<'_>) -> Layout {
        Layout {
            ty: self.ty.clone_ref(py),
            version: self.version,
        }
    }

    /// Whether `obj` is still of this type, which still has this version.
    pub(super) fn holds(&self, obj: &Bound<'_, PyAny>) -> bool {
        self.version.holds(obj)
    }
}

impl Watched {
    /// Follow a call's write-back: each recorded value that is a bound leaf becomes what the
    /// write-back left in that leaf's place (`leaves`, the call's bound leaves); nothing is
    /// read from the object (see `bound/mod.rs`). The values replaced go into `dropped`.
    pub(super) fn follow(&mut self, leaves: &Bound<'_, PyList>, dropped: &mut Vec<Py<PyAny>>) {
        match self {
            Watched::List(_, items, followed) => {
                for &(at, leaf) in followed.iter() {
                    if let Some(value) = items.get_mut(at as usize) {
                        follow_value(value, leaf, leaves, dropped);
                    }
                }
            }
            Watched::Dict(_, items) => items.follow(leaves, dropped),
            Watched::Attributes(_, _, items, plain) => {
                items.follow(leaves, dropped);
                plain.iter_mut().for_each(|w| w.follow(leaves, dropped));
            }
            Watched::Slots(_, _, slots, plain) => {
                for slot in slots.iter_mut() {
                    if let (Some(value), Some(leaf)) = (slot.value.as_mut(), slot.leaf) {
                        follow_value(value, leaf, leaves, dropped);
                    }
                }
                plain.iter_mut().for_each(|w| w.follow(leaves, dropped));
            }
            Watched::Flatten(node) => node.follow(leaves, dropped),
            // Neither a set's items nor a dict's key order nor a type is a leaf.
            Watched::Set(..) | Watched::Order(..) | Watched::Type(..) => {}
        }
    }

    /// Whether the object still holds what was recorded. `owner`: the watched object itself,
    /// given by the caller where the record let go of it (`Snapshot::release`).
    pub(super) fn unchanged<'py>(
        &self,
        py: Python<'py>,
        gate: Internals,
        owner: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<bool> {
        Ok(match self {
            Watched::List(obj, items, _) => owner_of(py, obj, owner)
                .cast::<PyList>()
                .is_ok_and(|l| same_list(l, items)),
            Watched::Dict(obj, items) => {
                (owner_of(py, obj, owner).cast::<PyDict>()).is_ok_and(|d| items.same(gate, d))
            }
            Watched::Set(obj, items) | Watched::Order(obj, items) => {
                same_items(owner_of(py, obj, owner), items)?
            }
            Watched::Type(obj, layout) => layout.holds(owner_of(py, obj, owner)),
            Watched::Attributes(watched, attrs, items, plain) => {
                stored_dict(owner_of(py, watched, owner))?.is(attrs)
                    && items.same(gate, attrs.bind(py))
                    && all_unchanged(py, gate, plain)?
            }
            Watched::Slots(obj, layout, slots, plain) => {
                let obj = owner_of(py, obj, owner);
                for slot in slots {
                    if !slot.holds(gate, layout, obj)? {
                        return Ok(false); // the class or the slot changed
                    }
                }
                all_unchanged(py, gate, plain)?
            }
            // Checked by `Snapshot::unchanged` before every other watch.
            Watched::Flatten(_) => true,
        })
    }

    /// Where the watched object is held (for `Snapshot::release`).
    pub(super) fn owner_mut(&mut self) -> &mut Py<PyAny> {
        match self {
            Watched::List(obj, ..)
            | Watched::Dict(obj, ..)
            | Watched::Set(obj, ..)
            | Watched::Order(obj, ..)
            | Watched::Type(obj, ..)
            | Watched::Attributes(obj, ..)
            | Watched::Slots(obj, ..) => obj,
            Watched::Flatten(node) => node.owner_mut(),
        }
    }

    /// Whether an object's `__dict__`, or a dict its attributes or slots hold, had been
    /// changed after `since` (`Internals::dict_clock`) when it was read. Not a dict of the tree: a
    /// registered flatten may build one (`return ({"w": self.w},), None`), new, so changed
    /// after `since`, and the take checks each against the flatten's children instead.
    pub(super) fn attributes_changed_after(&self, since: u64) -> bool {
        let plain_changed = |plain: &[Watched]| {
            (plain.iter()).any(|w| matches!(w, Watched::Dict(_, items) if items.version > since))
        };
        match self {
            Watched::Attributes(_, _, items, plain) => {
                items.version > since || plain_changed(plain)
            }
            Watched::Slots(_, _, _, plain) => plain_changed(plain),
            _ => false,
        }
    }
}

/// The watched object: `owner` where the caller gives it, else the one the record holds.
fn owner_of<'a, 'py>(
    py: Python<'py>,
    stored: &'a Py<PyAny>,
    owner: Option<&'a Bound<'py, PyAny>>,
) -> &'a Bound<'py, PyAny> {
    owner.unwrap_or_else(|| stored.bind(py))
}

pub(super) fn all_unchanged(
    py: Python<'_>,
    gate: Internals,
    watched: &[Watched],
) -> PyResult<bool> {
    for w in watched {
        if !w.unchanged(py, gate, None)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A list watched: its items, and which of them are bound leaves.
pub(super) fn watch_list(obj: Py<PyAny>, list: &Bound<'_, PyList>, index: &LeafIndex) -> Watched {
    let items: Vec<Py<PyAny>> = list.iter().map(Bound::unbind).collect();
    let followed = index.followed(items.iter());
    Watched::List(obj, items, followed)
}
