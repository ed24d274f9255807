//! The plain containers (lists, dicts, sets, tuples, nested) an object's attributes or slots
//! hold that are not nodes of the tree: a registered flatten may read them, so they are
//! watched too.

use super::follow::LeafIndex;
use super::items::{iter_items, DictItems};
use super::watched::{watch_list, Watched};
use crate::cpython::Internals;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PySet, PyTuple};
use std::collections::HashSet;

/// How deep plain containers held by attributes are followed; deeper (or cyclic) ones make
/// the snapshot uncheckable.
const PLAIN_DEPTH: usize = 16;

/// The plain containers among some values, watched, with their contents.
pub(super) struct Plain<'a> {
    pub(super) gate: Internals,
    /// Tree containers (watched on their own): not watched again.
    pub(super) tree: &'a HashSet<usize>,
    pub(super) index: &'a LeafIndex,
    pub(super) watched: Vec<Watched>,
    /// Plain containers already watched (shared, or a cycle).
    pub(super) seen: HashSet<usize>,
    /// False when the containers nest deeper than `PLAIN_DEPTH`.
    pub(super) complete: bool,
}

impl<'a> Plain<'a> {
    pub(super) fn new(gate: Internals, tree: &'a HashSet<usize>, index: &'a LeafIndex) -> Self {
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
    pub(super) fn add(&mut self, value: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
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
pub(super) fn is_plain(gate: Internals, value: &Bound<'_, PyAny>) -> bool {
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
