//! `Snapshot`, the record of `jit_partial`'s bound arguments, and its Python methods: take
//! (with the flatten), follow a write-back (`refresh`), check (`unchanged`).

use super::follow::follow_at;
use super::reflatten::Reflatten;
use super::watched::Watched;
use crate::cpython::{internals, Internals};
use crate::registry::registry_size;
use crate::sharing::SharedTreeDef;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyWeakrefMethods, PyWeakrefReference};
use std::collections::HashSet;

/// The contents, by identity, of the containers among some objects (see `bound/mod.rs`).
#[pyclass(module = "treeclone._native")]
pub struct Snapshot {
    pub(super) watched: Vec<Watched>,
    /// The node (index into the objects taken) each watched entry belongs to.
    pub(super) owners: Vec<usize>,
    /// False when some container's state is out of reach (see `bound/mod.rs`).
    #[pyo3(get)]
    pub(super) checkable: bool,
    /// The size of JAX's registry when the objects were flattened: a type registered since
    /// (a bound leaf's class made a node) changes what a flatten would give.
    pub(super) registry_len: usize,
    /// The last tuple of node indices `refresh` was given (a trace's record, the same tuple at
    /// every call; held, so that its address is not reused) and the watched entries it names.
    pub(super) written: Option<(Py<PyTuple>, Vec<usize>)>,
    /// Leave to read CPython's internals the record was taken with (None: off, and nothing
    /// recorded; not checkable).
    pub(super) gate: Option<Internals>,
    /// The watched entries whose object the record let go of (`release`), in order, each
    /// with a weak reference to that object: a check finds it there, and one whose object
    /// died says "changed".
    pub(super) released: Vec<(usize, Py<PyWeakrefReference>)>,
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
    /// the snapshot was taken with): see `bound/mod.rs`. Nothing is read from the
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
        let (flattens, released) = {
            let Ok(this) = slf.try_borrow() else {
                return Ok(false);
            };
            let flattens: Vec<(usize, Reflatten)> = (this.watched.iter().enumerate())
                .filter_map(|(at, w)| match w {
                    Watched::Flatten(node) => Some((at, node.clone_ref(py))),
                    _ => None,
                })
                .collect();
            let released: Vec<(usize, Py<PyWeakrefReference>)> = (this.released.iter())
                .map(|(at, r)| (*at, r.clone_ref(py)))
                .collect();
            (flattens, released)
        };
        // The objects let go of, alive (held here while the check runs), or "changed".
        let mut owners = Vec::with_capacity(released.len());
        for (at, weak) in &released {
            let Some(owner) = weak.bind(py).upgrade() else {
                return Ok(false);
            };
            owners.push((*at, owner));
        }
        let owner_at = |at: usize| {
            (owners.iter())
                .find(|(a, _)| *a == at)
                .map(|(_, owner)| owner)
        };
        for (at, node) in &flattens {
            if !node.unchanged(py, owner_at(*at)) {
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
        for (at, w) in this.watched.iter().enumerate() {
            if !w.unchanged(py, gate, owner_at(at))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Let go of the objects of these nodes (node indices, as `refresh` takes them): the
    /// record holds each by a weak reference from now on, so that it keeps none of them
    /// alive (`treeclone.jit`'s cache of its arguments, rule J32). A TypeError where
    /// one cannot be referred to weakly (nothing is let go of then).
    fn release(&mut self, py: Python<'_>, nodes: Vec<usize>) -> PyResult<()> {
        let nodes: HashSet<usize> = nodes.into_iter().collect();
        let mut released = Vec::new();
        for (at, owner) in self.owners.iter().enumerate() {
            if nodes.contains(owner) && !self.released.iter().any(|(a, _)| *a == at) {
                let obj = self.watched[at].owner_mut().bind(py);
                released.push((at, PyWeakrefReference::new(obj)?.unbind()));
            }
        }
        // Every weak reference made: now let go (None in each place).
        let gone: Vec<Py<PyAny>> = (released.iter())
            .map(|(at, _)| std::mem::replace(self.watched[*at].owner_mut(), py.None()))
            .collect();
        self.released.extend(released);
        self.released.sort_by_key(|(at, _)| *at);
        drop(gone);
        Ok(())
    }

    /// How many registered nodes each check flattens again (their flatten may read more than
    /// is watched: see `bound/mod.rs`); 0 for an nnx model, a dict of arrays.
    #[getter]
    fn flattened_at_each_check(&self) -> usize {
        (self.watched.iter())
            .filter(|w| matches!(w, Watched::Flatten(_)))
            .count()
    }
}
