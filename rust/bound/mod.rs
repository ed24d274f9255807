//! `Snapshot`: what the containers of `jit_partial`'s bound arguments hold, by identity, so
//! that a call can tell cheaply whether anything changed them since they were flattened.
//!
//! Each container's items (a list's or dict's) and instance attributes are recorded as the
//! objects they are. A call compares them, in Rust: a leaf or child replaced, a key or
//! attribute added or removed, a list resized all show. For every container that is not an
//! exact list or dict, the snapshot also records its type and the type's version (`__class__`
//! can be reassigned; a flatten may read the class: a setting every instance shares, a
//! property hiding an attribute), its `__dict__` itself (it can be replaced wholesale), its
//! slots (read through their member descriptors), a dict subclass's key order (an
//! `OrderedDict`'s `move_to_end` leaves its items as they were), and the contents of the plain
//! containers (lists, dicts, sets, tuples, nested) its attributes hold that are not nodes of
//! the tree: a registered flatten may read its children or its aux data from them
//! (`self._store["w"]`, nnx's `_var_metadata`). A class without a version (CPython stops
//! giving new ones to a class changed very often) cannot be watched: such a snapshot is not
//! `checkable`. The size of JAX's registry is watched too: a type registered since the flatten
//! (a bound leaf's class made a node) changes what a flatten gives.
//!
//! What the watches say is enough only for flattens that read nothing else: flax nnx's, run
//! natively (`KnownFlatten::reads_only_watched`). Every other registered node (a flatten
//! written in Python, JAX's own for `OrderedDict` and `defaultdict`, `register_dataclass`'s)
//! may read C-level state (a `defaultdict`'s `default_factory`), another object's attributes
//! or a module-level setting, and a child being the same object as some watched value (a small
//! int, `True`, a cached array) does not say the flatten read it there: such a node is
//! flattened again, one level, at each check, and its children and aux data compared with
//! the recorded ones (`reflatten`). An nnx node with no state in reach (no `__dict__`, no
//! slots) is not checkable: the bound arguments are flattened again at each call instead. An exact list's or dict's record must
//! be its flatten's children (the very keys and values): Python code that ran later in the
//! same flatten (a registered flatten, another thread meanwhile) may have changed it after it
//! was read, and a record of that change would stand for a cache that never saw it. For the
//! same reason a dict whose version (PEP 509) says it changed after the flatten began makes
//! the snapshot uncheckable (`Snapshot::flatten_and_take`).
//!
//! Type versions, slots read in place and dict versions are CPython internals (`cpython/`):
//! where they are off, no snapshot is checkable, and the bound arguments are flattened at
//! every call.
//!
//! After a call, the record follows the call's own write-back without reading the containers
//! again (`Snapshot::refresh`): each recorded value that is one of the bound leaves is
//! replaced by what the write-back left in that leaf's place (the call's new list of bound
//! leaves, in the order of the one the snapshot was taken with). Whatever else wrote into the
//! containers during the call (another thread, while the computation ran) is then not in the
//! record, and shows at the next `unchanged`.

mod leaves;
mod reflatten;

pub use leaves::{any_identical, Taker};
use reflatten::Reflatten;

use crate::cpython::{internals, Internals, SlotAt, TypeVersion};
use crate::keys::address::AddressMap;
use crate::node::NodeKind;
use crate::registry::registry_size;
use crate::sharing::{Entry, SharedTreeDef};
use pyo3::exceptions::PyAttributeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PySet, PyString, PyTuple, PyType};
use std::collections::{HashMap, HashSet};

/// How deep plain containers held by attributes are followed; deeper (or cyclic) ones make
/// the snapshot uncheckable.
const PLAIN_DEPTH: usize = 16;

/// A watched slot: its member descriptor, the value it held (None: unset), where the
/// descriptor is a plain object member of a class the object is an instance of, the place in
/// the object where the value is stored under the object's `Layout`, read there while it
/// holds (three slots of each nnx Variable at every `jit_partial` call), and the index among
/// the bound leaves of the value it held, if it is one (`LeafIndex`).
struct SlotValue {
    descr: Py<PyAny>,
    value: Option<Py<PyAny>>,
    at: Option<SlotAt>,
    leaf: Option<u32>,
}

/// The positions among some recorded values that hold bound leaves, each with the leaf's index
/// among the bound leaves (`LeafIndex::followed`).
type Followed = Vec<(u32, u32)>;

/// Each bound leaf's index in the list of leaves a snapshot is taken with, by address (the
/// leaves are held by that list, and by the record, meanwhile). An object at two indices (a
/// Python scalar: arrays appear once) is at neither: a value the record cannot follow, which,
/// if a call replaces it, makes the next check false.
struct LeafIndex(AddressMap<usize, u32>);

const AMBIGUOUS: u32 = u32::MAX;

impl LeafIndex {
    fn of(leaves: &Bound<'_, PyList>) -> LeafIndex {
        let mut index = AddressMap::with_capacity_and_hasher(leaves.len(), Default::default());
        for (i, leaf) in leaves.iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(AMBIGUOUS);
            index
                .entry(leaf.as_ptr() as usize)
                .and_modify(|at| *at = AMBIGUOUS)
                .or_insert(i);
        }
        LeafIndex(index)
    }

    fn get(&self, value: &Py<PyAny>) -> Option<u32> {
        let at = self.0.get(&(value.as_ptr() as usize)).copied()?;
        (at != AMBIGUOUS).then_some(at)
    }

    /// The positions among `values` that hold bound leaves, with the leaves' indices.
    fn followed<'a>(&self, values: impl Iterator<Item = &'a Py<PyAny>>) -> Followed {
        (values.enumerate())
            .filter_map(|(at, v)| Some((u32::try_from(at).ok()?, self.get(v)?)))
            .collect()
    }
}

/// Put in place of `value` what the call's write-back left in the place of the bound leaf
/// `leaf` (`leaves`: the call's bound leaves); the value replaced goes into `dropped`, to be
/// let go after (a finalizer it runs could change what is watched). Whether it was replaced.
/// An index out of range (never, for the same structure) leaves the value as it is: the
/// check then compares it with the object.
fn follow_value(
    value: &mut Py<PyAny>,
    leaf: u32,
    leaves: &Bound<'_, PyList>,
    dropped: &mut Vec<Py<PyAny>>,
) -> bool {
    match leaves.get_item(leaf as usize) {
        Ok(now) if !now.is(&*value) => {
            dropped.push(std::mem::replace(value, now.unbind()));
            true
        }
        _ => false,
    }
}

/// A type (held, so that its address is not reused) and its slots' member descriptors.
type TypeSlots = (Py<PyType>, Vec<Py<PyAny>>);

/// One watched object and what it held.
enum Watched {
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
struct Layout {
    ty: Py<PyType>,
    version: TypeVersion,
}

impl Layout {
    /// The version of `obj`'s type now; None where the type has none (CPython gives a tag at
    /// a lookup on the type and stops giving a class new ones after many changes to it).
    fn of(gate: Internals, obj: &Bound<'_, PyAny>) -> Option<Layout> {
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

    fn clone_ref(&self, py: Python<'_>) -> Layout {
        Layout {
            ty: self.ty.clone_ref(py),
            version: self.version,
        }
    }

    /// Whether `obj` is still of this type, which still has this version.
    fn holds(&self, obj: &Bound<'_, PyAny>) -> bool {
        self.version.holds(obj)
    }
}

/// The plain containers among some values, watched, with their contents.
struct Plain<'a> {
    gate: Internals,
    /// Tree containers (watched on their own): not watched again.
    tree: &'a HashSet<usize>,
    index: &'a LeafIndex,
    watched: Vec<Watched>,
    /// Plain containers already watched (shared, or a cycle).
    seen: HashSet<usize>,
    /// False when the containers nest deeper than `PLAIN_DEPTH`.
    complete: bool,
}

impl<'a> Plain<'a> {
    fn new(gate: Internals, tree: &'a HashSet<usize>, index: &'a LeafIndex) -> Self {
        Plain {
            gate,
            tree,
            index,
            watched: Vec::new(),
            seen: HashSet::new(),
            complete: true,
        }
    }

    /// Record `value`, and watch it (and what it holds) if it is a plain container.
    fn add(&mut self, value: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
        let at = value.as_ptr() as usize;
        let ty = value.get_type();
        let plain = is_plain(self.gate, value);
        // A namedtuple or a registered subclass is still its base's kind of container; only
        // the tree's own containers (watched on their own) are skipped.
        if !plain || self.tree.contains(&at) || !self.seen.insert(at) {
            return Ok(());
        }
        if depth >= PLAIN_DEPTH {
            self.complete = false;
            return Ok(());
        }
        let obj = value.clone().unbind();
        let mut items: Vec<Bound<'_, PyAny>> = Vec::new();
        if let Ok(list) = value.cast::<PyList>() {
            self.watched.push(watch_list(obj, list, self.index));
            items.extend(list.iter());
        } else if let Ok(dict) = value.cast::<PyDict>() {
            self.watched.push(Watched::Dict(
                obj,
                DictItems::read(self.gate, dict, self.index),
            ));
            if !ty.is(value.py().get_type::<PyDict>()) {
                let keys = iter_items(value)?;
                self.watched
                    .push(Watched::Order(value.clone().unbind(), keys));
            }
            for (k, v) in dict.iter() {
                items.push(k);
                items.push(v);
            }
        } else if value.is_instance_of::<PySet>() {
            let set_items = iter_items(value)?;
            items.extend(set_items.iter().map(|i| i.bind(value.py()).clone()));
            self.watched.push(Watched::Set(obj, set_items));
        } else {
            // A tuple or frozenset: immutable, only what it holds is watched.
            items.extend(value.try_iter()?.collect::<PyResult<Vec<_>>>()?);
        }
        for item in &items {
            self.add(item, depth + 1)?;
        }
        Ok(())
    }
}

/// Whether `value` is a container whose items `Plain` watches. Asked of every value a
/// write-back replaces (an array, most often): a set's subclass check walks the MRO, so the
/// last type found to be no set is remembered by its version tag (unique to one version of
/// one type, so a later `__bases__` cannot make it wrong).
fn is_plain(gate: Internals, value: &Bound<'_, PyAny>) -> bool {
    thread_local! {
        static NOT_A_SET: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    if value.is_instance_of::<PyList>()
        || value.is_instance_of::<PyTuple>()
        || value.is_instance_of::<PyDict>()
    {
        return true;
    }
    let tag = gate.type_tag(value).map(std::num::NonZeroU32::get);
    if tag.is_some() && tag == Some(NOT_A_SET.get()) {
        return false;
    }
    let set = value.is_instance_of::<PySet>() || value.is_instance_of::<PyFrozenSet>();
    if let (false, Some(tag)) = (set, tag) {
        NOT_A_SET.set(tag);
    }
    set
}

/// An iterable's items, in iteration order.
fn iter_items(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Py<PyAny>>> {
    obj.try_iter()?.map(|i| i.map(Bound::unbind)).collect()
}

/// Whether `items` are `now`'s items, by identity, in order.
fn same_items(now: &Bound<'_, PyAny>, items: &[Py<PyAny>]) -> PyResult<bool> {
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
fn stored_dict<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `obj` is alive and the GIL is held; the result is a new reference or NULL with
    // an exception set, which `from_owned_ptr_or_err` takes over.
    unsafe {
        Bound::from_owned_ptr_or_err(
            obj.py(),
            pyo3::ffi::PyObject_GenericGetDict(obj.as_ptr(), std::ptr::null_mut()),
        )
    }
}

impl Watched {
    /// Follow a call's write-back: each recorded value that is a bound leaf becomes what the
    /// write-back left in that leaf's place (`leaves`, the call's bound leaves); nothing is
    /// read from the object (see the module comment). The values replaced go into `dropped`.
    fn follow(&mut self, leaves: &Bound<'_, PyList>, dropped: &mut Vec<Py<PyAny>>) {
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

    fn unchanged(&self, py: Python<'_>, gate: Internals) -> PyResult<bool> {
        Ok(match self {
            Watched::List(obj, items, _) => obj
                .bind(py)
                .cast::<PyList>()
                .is_ok_and(|l| same_list(l, items)),
            Watched::Dict(obj, items) => {
                (obj.bind(py).cast::<PyDict>()).is_ok_and(|d| items.same(gate, d))
            }
            Watched::Set(obj, items) | Watched::Order(obj, items) => {
                same_items(obj.bind(py), items)?
            }
            Watched::Type(obj, layout) => layout.holds(obj.bind(py)),
            Watched::Attributes(owner, attrs, items, plain) => {
                stored_dict(owner.bind(py))?.is(attrs)
                    && items.same(gate, attrs.bind(py))
                    && all_unchanged(py, gate, plain)?
            }
            Watched::Slots(obj, layout, slots, plain) => {
                let obj = obj.bind(py);
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

    /// Whether an object's `__dict__`, or a dict its attributes or slots hold, had been
    /// changed after `since` (`Internals::dict_clock`) when it was read. Not a dict of the tree: a
    /// registered flatten may build one (`return ({"w": self.w},), None`), new, so changed
    /// after `since`, and the take checks each against the flatten's children instead.
    fn attributes_changed_after(&self, since: u64) -> bool {
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

fn all_unchanged(py: Python<'_>, gate: Internals, watched: &[Watched]) -> PyResult<bool> {
    for w in watched {
        if !w.unchanged(py, gate)? {
            return Ok(false);
        }
    }
    Ok(true)
}

impl SlotValue {
    /// The slot of `descr` on `obj`, read now (`layout`: the object's, `index`: the bound
    /// leaves).
    fn read(
        gate: Internals,
        layout: &Layout,
        obj: &Bound<'_, PyAny>,
        descr: Bound<'_, PyAny>,
        index: &LeafIndex,
    ) -> PyResult<SlotValue> {
        let at = (gate.slot_at(obj, &descr, false)).filter(|at| at.version() == layout.version);
        let value = match at.and_then(|at| at.read(obj)) {
            Some(value) => value,
            None => read_slot(obj, &descr)?,
        };
        let value = value.map(Bound::unbind);
        Ok(SlotValue {
            descr: descr.unbind(),
            leaf: value.as_ref().and_then(|v| index.get(v)),
            value,
            at,
        })
    }

    /// Whether the slot still holds its value, by identity, and the object's `layout` still
    /// holds (asked for each slot: a read through a descriptor may run Python code), without
    /// taking a reference where the value is read in the object.
    fn holds(&self, gate: Internals, layout: &Layout, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
        let value = self.value.as_ref().map_or(std::ptr::null_mut(), Py::as_ptr);
        if let Some(at) = self.at {
            // Under the layout's version (checked by `holds`): where the object stores it.
            return Ok(at.holds(obj, value));
        }
        if !layout.holds(obj) {
            return Ok(false);
        }
        let descr = self.descr.bind(obj.py());
        if let Some(held) = gate.member_value(obj, descr) {
            return Ok(held == value);
        }
        Ok(match (read_slot(obj, descr)?, &self.value) {
            (Some(a), Some(b)) => a.is(b),
            (None, None) => true,
            _ => false,
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
    // SAFETY: `descr` is alive, so is its type; `PyType_GetSlot` (public, any type from 3.10)
    // gives its `tp_descr_get`, NULL for none, which `Option` of a function pointer stands for.
    let get = unsafe {
        let slot = ffi::PyType_GetSlot(ffi::Py_TYPE(descr.as_ptr()), ffi::Py_tp_descr_get);
        std::mem::transmute::<*mut std::ffi::c_void, Option<ffi::descrgetfunc>>(slot)
    };
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
    gate: Internals,
    layout: &Layout,
    obj: &Bound<'py, PyAny>,
    descrs: Vec<Bound<'py, PyAny>>,
    index: &LeafIndex,
) -> PyResult<Vec<SlotValue>> {
    descrs
        .into_iter()
        .map(|descr| SlotValue::read(gate, layout, obj, descr, index))
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

/// A list watched: its items, and which of them are bound leaves.
fn watch_list(obj: Py<PyAny>, list: &Bound<'_, PyList>, index: &LeafIndex) -> Watched {
    let items: Vec<Py<PyAny>> = list.iter().map(Bound::unbind).collect();
    let followed = index.followed(items.iter());
    Watched::List(obj, items, followed)
}

/// The objects at the child entries of node `i` of `def` (`objects`: one per entry).
fn children_of<'py>(
    def: &SharedTreeDef,
    objects: &Bound<'py, PyList>,
    i: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    (def.child_indices(i)?.into_iter())
        .map(|c| objects.get_item(c))
        .collect()
}

/// Whether `recorded` are `children`, in order, by identity.
fn same_objects(
    recorded: impl ExactSizeIterator<Item = *mut pyo3::ffi::PyObject>,
    children: &[Bound<'_, PyAny>],
) -> bool {
    recorded.len() == children.len() && recorded.zip(children).all(|(r, c)| r == c.as_ptr())
}

/// A dict's items, by identity, in order, with its version tag when they were read and which
/// values are bound leaves.
struct DictItems {
    /// The dict's PEP 509 version (`Internals::dict_version`; 0: none to go by).
    version: u64,
    items: Vec<(Py<PyAny>, Py<PyAny>)>,
    followed: Followed,
}

impl DictItems {
    fn read(gate: Internals, dict: &Bound<'_, PyDict>, index: &LeafIndex) -> Self {
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
    fn follow(&mut self, leaves: &Bound<'_, PyList>, dropped: &mut Vec<Py<PyAny>>) {
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
    fn are(&self, keys: &Bound<'_, PyTuple>, children: &[Bound<'_, PyAny>]) -> bool {
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
    fn same(&self, gate: Internals, dict: &Bound<'_, PyDict>) -> bool {
        if self.version != 0 && gate.dict_version(dict) == self.version {
            return true;
        }
        // SAFETY: `dict` is alive (a Bound) and the GIL is held; nothing below runs Python.
        unsafe { same_dict_items(dict.as_ptr(), &self.items) }
    }
}

fn same_list(list: &Bound<'_, PyList>, items: &[Py<PyAny>]) -> bool {
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

/// The contents, by identity, of the containers among some objects (see the module comment).
#[pyclass(module = "treeclone._native")]
pub struct Snapshot {
    watched: Vec<Watched>,
    /// The node (index into the objects taken) each watched entry belongs to.
    owners: Vec<usize>,
    /// False when some container's state is out of reach (see the module comment).
    #[pyo3(get)]
    checkable: bool,
    /// The size of JAX's registry when the objects were flattened: a type registered since
    /// (a bound leaf's class made a node) changes what a flatten would give.
    registry_len: usize,
    /// The last tuple of node indices `refresh` was given (a trace's record, the same tuple at
    /// every call; held, so that its address is not reused) and the watched entries it names.
    written: Option<(Py<PyTuple>, Vec<usize>)>,
    /// Leave to read CPython's internals the record was taken with (None: off, and nothing
    /// recorded; not checkable).
    gate: Option<Internals>,
}

impl Snapshot {
    /// `take`, with the size JAX's registry had when the objects were flattened.
    fn record(
        objects: &Bound<'_, PyList>,
        def: &Bound<'_, SharedTreeDef>,
        leaves: &Bound<'_, PyList>,
        registry_len: usize,
    ) -> PyResult<Self> {
        let Some(gate) = internals() else {
            // Without CPython's internals nothing can be watched: the bound arguments are
            // flattened at every call.
            return Ok(Snapshot {
                watched: Vec::new(),
                owners: Vec::new(),
                checkable: false,
                registry_len,
                written: None,
                gate: None,
            });
        };
        let py = objects.py();
        let def = def.get();
        let index = LeafIndex::of(leaves);
        let mut watched = Vec::new();
        let mut owners = Vec::new();
        let mut checkable = true;
        let mut nodes = Vec::new();
        let mut tree = HashSet::new();
        for (i, entry) in def.entries.iter().enumerate() {
            let Entry::Node(node) = entry else { continue };
            let obj = objects.get_item(i)?;
            if obj.is_instance_of::<PyTuple>() || obj.is_none() {
                // Immutable, but a registered tuple subclass's flatten may read anything.
                if let NodeKind::Custom(custom, aux) = &node.kind {
                    if !custom.reads_only_watched() {
                        let node = Reflatten::record(def, objects, i, custom, aux, &index)?;
                        watched.push(Watched::Flatten(node));
                        owners.resize(watched.len(), i);
                    }
                }
                continue;
            }
            tree.insert(obj.as_ptr() as usize);
            nodes.push((i, obj, node));
        }
        // Slot descriptors by type version: many objects share a few types (an nnx model's
        // Variables). Each entry holds its type, so no address in the map can be reused
        // meanwhile, and a class changed during the take has a new tag.
        let mut slots_of: HashMap<(usize, u32), TypeSlots> = HashMap::new();
        for (i, obj, node) in nodes {
            // A registered node whose flatten may read more than is watched: run again at
            // each check (`reflatten`); its other watches stay, for what they catch early.
            let reflatten = match &node.kind {
                NodeKind::Custom(custom, aux) if !custom.reads_only_watched() => {
                    Some(Reflatten::record(def, objects, i, custom, aux, &index)?)
                }
                _ => None,
            };
            // An exact list or dict has neither a `__dict__` nor slots: no lookups (each would
            // raise and clear an AttributeError).
            if let Ok(list) = obj.cast_exact::<PyList>() {
                let watch = watch_list(obj.clone().unbind(), list, &index);
                if let Watched::List(_, items, _) = &watch {
                    let children = children_of(def, objects, i)?;
                    checkable &= same_objects(items.iter().map(Py::as_ptr), &children);
                }
                watched.push(watch);
                owners.resize(watched.len(), i);
                continue;
            }
            if let Ok(dict) = obj.cast_exact::<PyDict>() {
                let items = DictItems::read(gate, dict, &index);
                if let NodeKind::Dict(keys) = &node.kind {
                    let children = children_of(def, objects, i)?;
                    checkable &= items.are(keys.bind(py), &children);
                }
                watched.push(Watched::Dict(obj.clone().unbind(), items));
                owners.resize(watched.len(), i);
                continue;
            }
            // First, so that a reassigned `__class__` or a changed class is seen, and the
            // slots are read under the version recorded.
            let Some(layout) = Layout::of(gate, &obj) else {
                checkable = false; // the class cannot be watched: flattened at every call
                break;
            };
            let type_at = watched.len();
            watched.push(Watched::Type(obj.clone().unbind(), layout.clone_ref(py)));
            let mut known = false;
            if let Ok(list) = obj.cast::<PyList>() {
                watched.push(watch_list(obj.clone().unbind(), list, &index));
                known = true;
            } else if let Ok(dict) = obj.cast::<PyDict>() {
                let items = DictItems::read(gate, dict, &index);
                watched.push(Watched::Dict(obj.clone().unbind(), items));
                watched.push(Watched::Order(obj.clone().unbind(), iter_items(&obj)?));
                known = true;
            }
            // The instance dict the interpreter stores (a class may answer `obj.__dict__`
            // with something else: nnx's `Variable` makes one up; its state is in slots).
            if let Ok(attrs) = stored_dict(&obj) {
                match attrs.cast_into::<PyDict>() {
                    Ok(attrs) => {
                        let items = DictItems::read(gate, &attrs, &index);
                        let mut plain = Plain::new(gate, &tree, &index);
                        for (_, v) in attrs.iter() {
                            plain.add(&v, 0)?;
                        }
                        checkable &= plain.complete;
                        watched.push(Watched::Attributes(
                            obj.clone().unbind(),
                            attrs.unbind(),
                            items,
                            plain.watched,
                        ));
                        known = true;
                    }
                    Err(_) => checkable = false,
                }
            }
            let ty = layout.ty.bind(py);
            let version = (ty.as_ptr() as usize, layout.version.tag());
            let descrs = match slots_of.get(&version) {
                Some((_, descrs)) => descrs.iter().map(|d| d.bind(py).clone()).collect(),
                None => {
                    let descrs = slot_descriptors(ty)?;
                    // Kept for the next instances only if the class did not change meanwhile
                    // (this object's watch then fails at the next check).
                    if layout.holds(&obj) {
                        let kept = descrs.iter().map(|d| d.clone().unbind()).collect();
                        slots_of.insert(version, (ty.clone().unbind(), kept));
                    }
                    descrs
                }
            };
            if !descrs.is_empty() {
                let values = slot_values(gate, &layout, &obj, descrs, &index)?;
                let mut plain = Plain::new(gate, &tree, &index);
                for v in values.iter().filter_map(|slot| slot.value.as_ref()) {
                    plain.add(v.bind(py), 0)?;
                }
                checkable &= plain.complete;
                if layout.holds(&obj) {
                    // The layout's check, first in the slots' own, stands for the type watch.
                    watched.remove(type_at);
                }
                watched.push(Watched::Slots(
                    obj.clone().unbind(),
                    layout,
                    values,
                    plain.watched,
                ));
                known = true;
            }
            match reflatten {
                Some(node) => watched.push(Watched::Flatten(node)),
                // Trusted only where the flatten reads what is watched, and something is.
                None if !known => checkable = false,
                None => {}
            }
            owners.resize(watched.len(), i);
        }
        Ok(Snapshot {
            watched,
            owners,
            checkable,
            registry_len,
            written: None,
            gate: Some(gate),
        })
    }
}

#[pymethods]
impl Snapshot {
    /// Record the containers among `objects` (a flatten's objects, one per entry of `def`,
    /// its structure), whose leaves are `leaves` (the flatten's, which `refresh` follows).
    /// Tuples, namedtuples and None are immutable and need no record; their items are among
    /// `objects` themselves.
    #[staticmethod]
    fn take(
        objects: &Bound<'_, PyList>,
        def: &Bound<'_, SharedTreeDef>,
        leaves: &Bound<'_, PyList>,
    ) -> PyResult<Self> {
        Snapshot::record(objects, def, leaves, registry_size(objects.py())?)
    }

    /// `flatten_shared(tree)` and the snapshot of what it flattened (`take`), made in one
    /// native call: no Python code runs between a container's read and its record (none in the
    /// flatten either, for the nodes flattened natively), so another thread cannot change a
    /// container in between, unseen. The caller pauses the cyclic GC around it (finalizers).
    #[staticmethod]
    #[allow(clippy::type_complexity)]
    fn flatten_and_take<'py>(
        tree: &Bound<'py, PyAny>,
    ) -> PyResult<(
        Bound<'py, PyList>,
        Bound<'py, SharedTreeDef>,
        Bound<'py, PyList>,
        Snapshot,
    )> {
        let py = tree.py();
        // Read before the flatten: a type registered during it makes the next check false.
        let registry_len = registry_size(py)?;
        let since = internals().map_or(0, |gate| gate.dict_clock(py));
        let (leaves, def, objects) = crate::sharing::flatten_shared(tree)?.into_python(py)?;
        let mut snapshot = Snapshot::record(&objects, &def, &leaves, registry_len)?;
        // An attribute dict changed after the flatten began, by Python code the flatten ran (a
        // registered flatten, a key's `__lt__`) or by another thread meanwhile, may have been
        // read by the flatten before the change and by the take after it (static data an
        // attribute holds, two attributes swapped): its record cannot be trusted.
        if since != 0
            && snapshot
                .watched
                .iter()
                .any(|w| w.attributes_changed_after(since))
        {
            snapshot.checkable = false;
        }
        Ok((leaves, def, objects, snapshot))
    }

    /// Follow a call's write-back in the record of the objects at these node indices (those
    /// the write-back wrote), from the call's bound leaves (`leaves`, in the order of those
    /// the snapshot was taken with): see the module comment. Nothing is read from the
    /// objects, so a change made to them by anything but the write-back, or one the record
    /// cannot follow, makes the next `unchanged` false: a flatten too many, never a change
    /// missed.
    fn refresh(&mut self, nodes: &Bound<'_, PyAny>, leaves: &Bound<'_, PyList>) -> PyResult<()> {
        let cached = matches!(&self.written, Some((t, _)) if t.is(nodes));
        if !cached {
            let nodes_set: HashSet<usize> = nodes.extract::<Vec<usize>>()?.into_iter().collect();
            let positions: Vec<usize> = (self.owners.iter().enumerate())
                .filter(|(_, owner)| nodes_set.contains(owner))
                .map(|(i, _)| i)
                .collect();
            // A list can change under the same identity: only a tuple's positions are kept.
            let key = nodes.cast::<PyTuple>().ok().map(|t| t.clone().unbind());
            let Some(key) = key else {
                follow_at(&mut self.watched, &positions, leaves);
                return Ok(());
            };
            self.written = Some((key, positions));
        }
        let Snapshot {
            watched, written, ..
        } = self;
        let positions = written.as_ref().map_or(&[][..], |(_, p)| &p[..]);
        follow_at(watched, positions, leaves);
        Ok(())
    }

    /// Whether no type was registered and every watched object still holds exactly what it
    /// held.
    fn unchanged(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let py = slf.py();
        // The flattens run again first: Python code they run (or a finalizer at an
        // allocation) that changes a watched container is then seen by the watches below.
        // They run on a copy of their records, the snapshot not borrowed meanwhile: that code
        // may let another thread call the same `jit_partial`. A snapshot borrowed elsewhere
        // (a refresh under way in another thread) answers "changed": a flatten too many.
        let flattens: Vec<Reflatten> = {
            let Ok(this) = slf.try_borrow() else {
                return Ok(false);
            };
            (this.watched.iter())
                .filter_map(|w| match w {
                    Watched::Flatten(node) => Some(node.clone_ref(py)),
                    _ => None,
                })
                .collect()
        };
        for node in &flattens {
            if !node.unchanged(py) {
                return Ok(false);
            }
        }
        drop(flattens);
        let Ok(this) = slf.try_borrow() else {
            return Ok(false);
        };
        let Some(gate) = this.gate else {
            return Ok(false); // nothing was recorded
        };
        if registry_size(py)? != this.registry_len {
            return Ok(false);
        }
        all_unchanged(py, gate, &this.watched)
    }

    /// How many registered nodes each check flattens again (their flatten may read more than
    /// is watched: see the module comment); 0 for an nnx model, a dict of arrays.
    #[getter]
    fn flattened_at_each_check(&self) -> usize {
        (self.watched.iter())
            .filter(|w| matches!(w, Watched::Flatten(_)))
            .count()
    }
}

/// Follow a call's write-back in the entries of `watched` at `positions`; the values replaced
/// are let go after all are followed.
fn follow_at(watched: &mut [Watched], positions: &[usize], leaves: &Bound<'_, PyList>) {
    let mut dropped = Vec::new();
    for &i in positions {
        if let Some(w) = watched.get_mut(i) {
            w.follow(leaves, &mut dropped);
        }
    }
    drop(dropped);
}
