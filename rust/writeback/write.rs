//! The in-place writes of one call, all or nothing: rule J31's check before any is made,
//! then each container or object written (`write_one`), the undo log applied if one fails.

use super::attributes::write_attributes;
use super::list::{write_list, write_list_entries};
use super::mapping::{mapping_items, write_mapping, write_mapping_entries};
use super::plan::CallPlan;
use super::slots::SlotPlace;
use super::sources::{Origin, Outputs};
use super::undo::Undo;
use crate::node::{build_node, Node, NodeKind};
use crate::registry::{at_top_level, compat};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::ops::Range;

/// A pending in-place write: the caller's object, its node, its origin, and where its new
/// children are among all the writes' children (one vector for all: a call of an nnx step
/// writes hundreds of Variables, and a vector for each cost an allocation each).
pub(super) type Write<'a, 'py> = (Bound<'py, PyAny>, &'a Node, &'a Origin, Range<usize>);

impl CallPlan {
    /// Rule J31, before anything is written: inside a JAX transformation (not at the top
    /// level, one look at JAX's trace state), when an output is a tracer, `enclosing` is
    /// handed the pending writes and raises for a traced value bound for an object from
    /// outside the transformation.
    pub(super) fn check_enclosing<'py>(
        &self,
        py: Python<'py>,
        writes: &[Write<'_, 'py>],
        children: &[Bound<'py, PyAny>],
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
        outputs: &Outputs<'py>,
    ) -> PyResult<()> {
        let Some(check) = &self.enclosing else {
            return Ok(());
        };
        if writes.is_empty() || at_top_level(py)? {
            return Ok(());
        }
        let tracer = compat(py)?.tracer.bind(py);
        let mut traced = false;
        for i in 0..outputs.len() {
            if outputs.get(i)?.is_instance(tracer)? {
                traced = true;
                break;
            }
        }
        if !traced {
            return Ok(());
        }
        let pending = PyList::empty(py);
        for (_, _, origin, at) in writes {
            let new = PyTuple::new(py, &children[at.clone()])?;
            pending.append((origin.node, new))?;
        }
        let outputs = match outputs {
            Outputs::List(list) => list.clone().into_any(),
            Outputs::Tuple(tuple) => tuple.clone().into_any(),
        };
        check
            .bind(py)
            .call1((input_leaves, input_objects, outputs, pending))?;
        Ok(())
    }

    /// What the caller's tree held at entry `old` when the call started.
    pub(super) fn old_child<'py>(
        &self,
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
        old: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.input_slots.get(old) {
            Some(Some(slot)) => input_leaves.get_item(*slot),
            _ => input_objects.get_item(old),
        }
    }

    /// For an origin written entry by entry: the caller's children at call start, by place.
    pub(super) fn old_children<'py>(
        &self,
        origin: &Origin,
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        if !origin.by_entry {
            return Ok(None);
        }
        let old = origin
            .old_children
            .iter()
            .map(|&c| self.old_child(input_leaves, input_objects, c))
            .collect::<PyResult<_>>()?;
        Ok(Some(old))
    }

    pub(super) fn write_all<'py>(
        &self,
        py: Python<'py>,
        writes: Vec<Write<'_, 'py>>,
        children: &[Bound<'py, PyAny>],
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
    ) -> PyResult<()> {
        let mut done: Vec<Undo<'py>> = Vec::with_capacity(writes.len());
        // A copy: the lock is not held while Python code may run (a finalizer, a setter).
        let mut places = match self.slot_places.lock() {
            Ok(places) => places.clone(),
            Err(_) => Vec::new(),
        };
        let known = places.len();
        for (obj, node, origin, at) in writes {
            let mut write = Writing {
                plan: self,
                done: &mut done,
                places: &mut places,
            };
            let written = self
                .old_children(origin, input_leaves, input_objects)
                .and_then(|old| write_one(&obj, node, origin, &children[at], old, &mut write));
            if let Err(err) = written {
                // Put back what was written, newest first; the first error is the one
                // reported, so a failing undo is only attached as context.
                for undo in done.into_iter().rev() {
                    if let Err(e) = undo.apply() {
                        err.set_cause(py, Some(e));
                    }
                }
                return Err(err);
            }
        }
        if places.len() != known {
            if let Ok(mut kept) = self.slot_places.lock() {
                *kept = places;
            }
        }
        Ok(())
    }
}

/// What the writes of one call share: the plan, the undo log (how to undo each step taken,
/// also when a later step fails) and where attributes are stored (`slots.rs`).
pub(super) struct Writing<'a, 'py> {
    plan: &'a CallPlan,
    done: &'a mut Vec<Undo<'py>>,
    places: &'a mut Vec<SlotPlace>,
}

/// Give `obj` the contents `children` (and the node data of `node`) in place, pushing onto
/// the undo log how to undo each step taken.
pub(super) fn write_one<'py>(
    obj: &Bound<'py, PyAny>,
    node: &Node,
    origin: &Origin,
    children: &[Bound<'py, PyAny>],
    old: Option<Vec<Bound<'py, PyAny>>>,
    write: &mut Writing<'_, 'py>,
) -> PyResult<()> {
    let done = &mut *write.done;
    let py = obj.py();
    let key_order = origin.key_order.as_ref().map(|o| o.bind(py));
    let old_keys = origin.old_keys.as_ref().map(|k| k.bind(py));
    // The entries to compare with, for a container written entry by entry (rule J20).
    let list_old = old.as_deref();
    let dict_old = old.as_deref().zip(old_keys);
    match &node.kind {
        NodeKind::List => done.push(match list_old {
            Some(old) => write_list_entries(obj, children, old)?,
            None => write_list(obj, PyList::new(py, children)?.as_any())?,
        }),
        NodeKind::Dict(keys) => {
            let new = keys.bind(py).iter().zip(children.iter().cloned()).collect();
            done.push(match dict_old {
                Some((old, old_keys)) => {
                    write_mapping_entries(obj, new, key_order, origin.reordered, old_keys, old)?
                }
                None => write_mapping(obj, new, key_order, origin.reordered)?,
            });
        }
        NodeKind::Custom(..) if origin.direct.is_some() => {
            let direct = origin.direct.as_deref().unwrap_or_default();
            done.push(write_attributes(obj, direct, children, write.places)?);
        }
        NodeKind::Custom(..) => {
            let mut children = children.to_vec();
            let fresh = build_node(py, &node.kind, children.drain(..))?;
            // A registered dict or list subclass (OrderedDict, defaultdict, ...): its items
            // are written as a dict's or a list's, then its attributes as any object's.
            if obj.is_instance_of::<PyDict>() && fresh.is_instance_of::<PyDict>() {
                let new = mapping_items(&fresh)?;
                done.push(match dict_old {
                    Some((old, old_keys)) => {
                        write_mapping_entries(obj, new, key_order, origin.reordered, old_keys, old)?
                    }
                    None => write_mapping(obj, new, key_order, origin.reordered)?,
                });
            } else if obj.is_instance_of::<PyList>() && fresh.is_instance_of::<PyList>() {
                done.push(match list_old {
                    Some(old) => {
                        let new: Vec<_> = fresh.try_iter()?.collect::<PyResult<_>>()?;
                        write_list_entries(obj, &new, old)?
                    }
                    None => write_list(obj, &fresh)?,
                });
            }
            let attrs = origin.attrs.as_ref().map(|a| a.bind(py));
            let undo = write
                .plan
                .write_custom
                .bind(py)
                .call1((obj, fresh, attrs))?;
            done.push(Undo::Call(undo));
        }
        NodeKind::NamedTuple(_) | NodeKind::Tuple | NodeKind::None | NodeKind::Leaf => {
            return Err(PyTypeError::new_err(format!(
                "cannot update a {} in place",
                obj.get_type().name()?
            )))
        }
    }
    Ok(())
}
