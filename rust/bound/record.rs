//! `Snapshot::record`: the watches of a flatten's objects, node by node (an exact list or
//! dict; else the type, a container subclass's items, the instance dict, the slots, and the
//! flatten run again where it may read more than is watched).

use super::follow::LeafIndex;
use super::items::{children_of, iter_items, same_objects, stored_dict, DictItems};
use super::plain::Plain;
use super::reflatten::Reflatten;
use super::slots::{slot_descriptors, slot_values};
use super::snapshot::Snapshot;
use super::watched::{watch_list, Layout, Watched};
use crate::cpython::{internals, Internals};
use crate::node::{Node, NodeKind};
use crate::sharing::{Entry, SharedTreeDef};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use std::collections::{HashMap, HashSet};

/// A type (held, so that its address is not reused) and its slots' member descriptors.
pub(super) type TypeSlots = (Py<PyType>, Vec<Py<PyAny>>);

impl Snapshot {
    /// `take`, with the size JAX's registry had when the objects were flattened.
    pub(super) fn record(
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
                released: Vec::new(),
            });
        };
        let mut recording = Recording {
            gate,
            def: def.get(),
            objects,
            index: LeafIndex::of(leaves),
            tree: HashSet::new(),
            watched: Vec::new(),
            owners: Vec::new(),
            checkable: true,
            slots_of: HashMap::new(),
        };
        for (i, obj, node) in recording.mutable_nodes()? {
            if !recording.watch_node(i, &obj, node)? {
                recording.checkable = false; // the class cannot be watched: flattened at every call
                break;
            }
        }
        Ok(Snapshot {
            watched: recording.watched,
            owners: recording.owners,
            checkable: recording.checkable,
            registry_len,
            written: None,
            gate: Some(gate),
            released: Vec::new(),
        })
    }
}

/// What `Snapshot::record` builds as it goes through the tree's nodes.
pub(super) struct Recording<'a, 'py> {
    gate: Internals,
    def: &'a SharedTreeDef,
    /// The flatten's objects, one per entry of `def`.
    objects: &'a Bound<'py, PyList>,
    index: LeafIndex,
    /// The tree's containers (watched on their own, so not again as plain containers).
    tree: HashSet<usize>,
    watched: Vec<Watched>,
    /// The node each watched entry belongs to.
    owners: Vec<usize>,
    checkable: bool,
    /// Slot descriptors by type version: many objects share a few types (an nnx model's
    /// Variables). Each entry holds its type, so no address in the map can be reused
    /// meanwhile, and a class changed during the take has a new tag.
    slots_of: HashMap<(usize, u32), TypeSlots>,
}

impl<'a, 'py> Recording<'a, 'py> {
    /// The tree's nodes that can change, each with its object, marked as the tree's. Tuples,
    /// namedtuples and None cannot, but a registered tuple subclass's flatten may read
    /// anything: such a node is flattened again at each check.
    fn mutable_nodes(&mut self) -> PyResult<Vec<(usize, Bound<'py, PyAny>, &'a Node)>> {
        let mut nodes = Vec::new();
        for (i, entry) in self.def.entries.iter().enumerate() {
            let Entry::Node(node) = entry else { continue };
            let obj = self.objects.get_item(i)?;
            if obj.is_instance_of::<PyTuple>() || obj.is_none() {
                if let NodeKind::Custom(custom, aux) = &node.kind {
                    if !custom.reads_only_watched() {
                        let node =
                            Reflatten::record(self.def, self.objects, i, custom, aux, &self.index)?;
                        self.watched.push(Watched::Flatten(node));
                        self.owners.resize(self.watched.len(), i);
                    }
                }
                continue;
            }
            self.tree.insert(obj.as_ptr() as usize);
            nodes.push((i, obj, node));
        }
        Ok(nodes)
    }

    /// Watch node `i`, `obj`. False where its class cannot be watched (it has no version):
    /// the record stops there.
    fn watch_node(&mut self, i: usize, obj: &Bound<'py, PyAny>, node: &Node) -> PyResult<bool> {
        // A registered node whose flatten may read more than is watched: run again at
        // each check (`reflatten`); its other watches stay, for what they catch early.
        let reflatten = match &node.kind {
            NodeKind::Custom(custom, aux) if !custom.reads_only_watched() => Some(
                Reflatten::record(self.def, self.objects, i, custom, aux, &self.index)?,
            ),
            _ => None,
        };
        if self.watch_exact(i, obj, node)? {
            return Ok(true);
        }
        // First, so that a reassigned `__class__` or a changed class is seen, and the
        // slots are read under the version recorded.
        let Some(layout) = Layout::of(self.gate, obj) else {
            return Ok(false);
        };
        let type_at = self.watched.len();
        (self.watched).push(Watched::Type(
            obj.clone().unbind(),
            layout.clone_ref(obj.py()),
        ));
        let mut known = self.watch_items(obj)?;
        known |= self.watch_attributes(obj)?;
        known |= self.watch_slots(obj, layout, type_at)?;
        match reflatten {
            Some(node) => self.watched.push(Watched::Flatten(node)),
            // Trusted only where the flatten reads what is watched, and something is.
            None if !known => self.checkable = false,
            None => {}
        }
        self.owners.resize(self.watched.len(), i);
        Ok(true)
    }

    /// Watch node `i` if it is an exact list or dict, whose record must be its flatten's
    /// children (see `bound/mod.rs`): whether it is one. It has neither a `__dict__` nor
    /// slots: no lookups (each would raise and clear an AttributeError).
    fn watch_exact(&mut self, i: usize, obj: &Bound<'py, PyAny>, node: &Node) -> PyResult<bool> {
        if let Ok(list) = obj.cast_exact::<PyList>() {
            let watch = watch_list(obj.clone().unbind(), list, &self.index);
            if let Watched::List(_, items, _) = &watch {
                let children = children_of(self.def, self.objects, i)?;
                self.checkable &= same_objects(items.iter().map(Py::as_ptr), &children);
            }
            self.watched.push(watch);
        } else if let Ok(dict) = obj.cast_exact::<PyDict>() {
            let items = DictItems::read(self.gate, dict, &self.index);
            if let NodeKind::Dict(keys) = &node.kind {
                let children = children_of(self.def, self.objects, i)?;
                self.checkable &= items.are(keys.bind(obj.py()), &children);
            }
            self.watched
                .push(Watched::Dict(obj.clone().unbind(), items));
        } else {
            return Ok(false);
        }
        self.owners.resize(self.watched.len(), i);
        Ok(true)
    }

    /// Watch the items of a list or dict subclass (and a dict's key order): whether it is one.
    fn watch_items(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<bool> {
        if let Ok(list) = obj.cast::<PyList>() {
            (self.watched).push(watch_list(obj.clone().unbind(), list, &self.index));
        } else if let Ok(dict) = obj.cast::<PyDict>() {
            let items = DictItems::read(self.gate, dict, &self.index);
            self.watched
                .push(Watched::Dict(obj.clone().unbind(), items));
            (self.watched).push(Watched::Order(obj.clone().unbind(), iter_items(obj)?));
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    /// Watch the instance dict the interpreter stores (a class may answer `obj.__dict__`
    /// with something else: nnx's `Variable` makes one up; its state is in slots) and the
    /// plain containers it holds: whether there is one.
    fn watch_attributes(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<bool> {
        let Ok(attrs) = stored_dict(obj) else {
            return Ok(false);
        };
        let Ok(attrs) = attrs.cast_into::<PyDict>() else {
            self.checkable = false;
            return Ok(false);
        };
        let items = DictItems::read(self.gate, &attrs, &self.index);
        let mut plain = Plain::new(self.gate, &self.tree, &self.index);
        for (_, v) in attrs.iter() {
            plain.add(&v, 0)?;
        }
        self.checkable &= plain.complete;
        self.watched.push(Watched::Attributes(
            obj.clone().unbind(),
            attrs.unbind(),
            items,
            plain.watched,
        ));
        Ok(true)
    }

    /// Watch the slots of `obj`'s type and its bases, read under `layout`, and the plain
    /// containers they hold: whether it has any. Where the layout still holds after the read,
    /// its check (first in the slots' own) stands for the type watch at `type_at`.
    fn watch_slots(
        &mut self,
        obj: &Bound<'py, PyAny>,
        layout: Layout,
        type_at: usize,
    ) -> PyResult<bool> {
        let py = obj.py();
        let descrs = self.descriptors(obj, &layout)?;
        if descrs.is_empty() {
            return Ok(false);
        }
        let values = slot_values(self.gate, &layout, obj, descrs, &self.index)?;
        let mut plain = Plain::new(self.gate, &self.tree, &self.index);
        for v in values.iter().filter_map(|slot| slot.value.as_ref()) {
            plain.add(v.bind(py), 0)?;
        }
        self.checkable &= plain.complete;
        if layout.holds(obj) {
            self.watched.remove(type_at);
        }
        self.watched.push(Watched::Slots(
            obj.clone().unbind(),
            layout,
            values,
            plain.watched,
        ));
        Ok(true)
    }

    /// The member descriptors of the slots of `obj`'s type (`layout`'s), looked up once per
    /// type version.
    fn descriptors(
        &mut self,
        obj: &Bound<'py, PyAny>,
        layout: &Layout,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let py = obj.py();
        let ty = layout.ty.bind(py);
        let version = (ty.as_ptr() as usize, layout.version.tag());
        if let Some((_, descrs)) = self.slots_of.get(&version) {
            return Ok(descrs.iter().map(|d| d.bind(py).clone()).collect());
        }
        let descrs = slot_descriptors(ty)?;
        // Kept for the next instances only if the class did not change meanwhile (this
        // object's watch then fails at the next check).
        if layout.holds(obj) {
            let kept = descrs.iter().map(|d| d.clone().unbind()).collect();
            self.slots_of.insert(version, (ty.clone().unbind(), kept));
        }
        Ok(descrs)
    }
}
