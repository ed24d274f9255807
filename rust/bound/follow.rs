//! How the record follows a call's write-back without reading the containers again: each
//! bound leaf's index (`LeafIndex`), and the recorded values that are bound leaves replaced by
//! what the write-back left in their place.

use super::watched::Watched;
use crate::keys::address::AddressMap;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// The positions among some recorded values that hold bound leaves, each with the leaf's index
/// among the bound leaves (`LeafIndex::followed`).
pub(super) type Followed = Vec<(u32, u32)>;

/// Each bound leaf's index in the list of leaves a snapshot is taken with, by address (the
/// leaves are held by that list, and by the record, meanwhile). An object at two indices (a
/// Python scalar: arrays appear once) is at neither: a value the record cannot follow, which,
/// if a call replaces it, makes the next check false.
pub(super) struct LeafIndex(AddressMap<usize, u32>);

const AMBIGUOUS: u32 = u32::MAX;

impl LeafIndex {
    pub(super) fn of(leaves: &Bound<'_, PyList>) -> LeafIndex {
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

    pub(super) fn get(&self, value: &Py<PyAny>) -> Option<u32> {
        let at = self.0.get(&(value.as_ptr() as usize)).copied()?;
        (at != AMBIGUOUS).then_some(at)
    }

    /// The positions among `values` that hold bound leaves, with the leaves' indices.
    pub(super) fn followed<'a>(&self, values: impl Iterator<Item = &'a Py<PyAny>>) -> Followed {
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
pub(super) fn follow_value(
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

/// Follow a call's write-back in the entries of `watched` at `positions`; the values replaced
/// are let go after all are followed.
pub(super) fn follow_at(watched: &mut [Watched], positions: &[usize], leaves: &Bound<'_, PyList>) {
    let mut dropped = Vec::new();
    for &i in positions {
        if let Some(w) = watched.get_mut(i) {
            w.follow(leaves, &mut dropped);
        }
    }
    drop(dropped);
}
