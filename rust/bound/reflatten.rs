//! The registered nodes of `jit_partial`'s bound arguments whose flatten the snapshot cannot
//! vouch for, checked by running that flatten again (one level) at each check.
//!
//! The snapshot watches an object's instance dict, slots, the plain containers those hold and
//! its class under its version tag. That says the flatten would give the same children and aux
//! data only where the flatten reads nothing else: flax nnx's functions, run natively
//! (`KnownFlatten::reads_only_watched`). Any other flatten (a Python function, JAX's own for
//! `OrderedDict` and `defaultdict`, `register_dataclass`'s, whose `getattr` may run a property)
//! may read C-level state (a `defaultdict`'s `default_factory`), another object's attributes,
//! or a module-level setting, and a child that happens to be the same object as a watched
//! value (a small int, `True`, a cached array) says nothing about where the flatten read it.
//! So such a node is flattened again (its own level only: its children are watched or
//! re-flattened in their turn) and its children compared by identity, its aux data by
//! identity or `==` (as JAX compares treedefs).

use super::follow::{follow_value, LeafIndex};
use crate::node::{call_custom_flatten, NodeKind};
use crate::registry::CustomType;
use crate::sharing::{Entry, SharedTreeDef};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::sync::Arc;

/// How deep containers a flatten builds of its children are compared; deeper, the node's
/// child must be the very object recorded.
const BUILT_DEPTH: usize = 16;

/// What a child of a re-flattened node must be.
enum Expect {
    /// This very object; with its index among the bound leaves where it is one, so that the
    /// record follows a call's write-back.
    Is(Py<PyAny>, Option<u32>),
    /// A tuple, namedtuple, list or dict, which a flatten may build anew each time
    /// (`return ([self.a, self.b],), None`): this object, or one of the same exact type whose
    /// items are, in order (a dict's: under these keys), what the items expect.
    Built(Py<PyAny>, Vec<(Option<Py<PyAny>>, Expect)>),
}

impl Expect {
    /// What the object at entry `c` of `def` is recorded as.
    fn of(
        def: &SharedTreeDef,
        objects: &Bound<'_, PyList>,
        c: usize,
        index: &LeafIndex,
        depth: usize,
    ) -> PyResult<Expect> {
        let obj = objects.get_item(c)?.unbind();
        let keys = match def.entries.get(c) {
            Some(Entry::Node(node)) if depth < BUILT_DEPTH => match &node.kind {
                NodeKind::Tuple | NodeKind::List | NodeKind::NamedTuple(_) => None,
                NodeKind::Dict(keys) => Some(keys.bind(objects.py()).clone()),
                _ => {
                    let leaf = index.get(&obj);
                    return Ok(Expect::Is(obj, leaf));
                }
            },
            _ => {
                let leaf = index.get(&obj);
                return Ok(Expect::Is(obj, leaf));
            }
        };
        let children = def.child_indices(c)?;
        let mut items = Vec::with_capacity(children.len());
        for (at, child) in children.into_iter().enumerate() {
            let key = match &keys {
                Some(keys) => Some(keys.get_item(at)?.unbind()),
                None => None,
            };
            items.push((key, Expect::of(def, objects, child, index, depth + 1)?));
        }
        Ok(Expect::Built(obj, items))
    }

    fn clone_ref(&self, py: Python<'_>) -> Expect {
        match self {
            Expect::Is(obj, leaf) => Expect::Is(obj.clone_ref(py), *leaf),
            Expect::Built(obj, items) => Expect::Built(
                obj.clone_ref(py),
                (items.iter())
                    .map(|(k, e)| (k.as_ref().map(|k| k.clone_ref(py)), e.clone_ref(py)))
                    .collect(),
            ),
        }
    }

    fn follow(&mut self, leaves: &Bound<'_, PyList>, dropped: &mut Vec<Py<PyAny>>) {
        match self {
            Expect::Is(value, Some(leaf)) => {
                follow_value(value, *leaf, leaves, dropped);
            }
            Expect::Is(_, None) => {}
            Expect::Built(_, items) => {
                (items.iter_mut()).for_each(|(_, item)| item.follow(leaves, dropped));
            }
        }
    }

    /// Whether `now` (a child the flatten gave now) is what this expects.
    fn matches(&self, now: &Bound<'_, PyAny>) -> bool {
        let py = now.py();
        match self {
            Expect::Is(obj, _) => now.is(obj),
            Expect::Built(obj, items) => {
                // The very container: its items are watched (a list or dict) or immutable.
                if now.is(obj) {
                    return true;
                }
                if !now.get_type().is(obj.bind(py).get_type()) {
                    return false;
                }
                if let Ok(dict) = now.cast_exact::<PyDict>() {
                    return dict.len() == items.len()
                        && items.iter().all(|(key, item)| {
                            let value = key.as_ref().and_then(|k| dict.get_item(k).ok().flatten());
                            value.is_some_and(|v| item.matches(&v))
                        });
                }
                let now: Vec<Bound<'_, PyAny>> = if let Ok(list) = now.cast_exact::<PyList>() {
                    list.iter().collect()
                } else if let Ok(tuple) = now.cast::<PyTuple>() {
                    tuple.iter().collect()
                } else {
                    return false;
                };
                now.len() == items.len()
                    && now.iter().zip(items).all(|(n, (_, item))| item.matches(n))
            }
        }
    }
}

/// A registered node checked by flattening it again: the object, its type's registration,
/// what its children must be, and the aux data its flatten gave.
pub(super) struct Reflatten {
    obj: Py<PyAny>,
    custom: Arc<CustomType>,
    children: Vec<Expect>,
    aux: Py<PyAny>,
}

impl Reflatten {
    /// The record of node `i` of `def` (a custom node of type `custom` with aux data `aux`),
    /// from the flatten's `objects` (one per entry) and the bound leaves' `index`.
    pub(super) fn record(
        def: &SharedTreeDef,
        objects: &Bound<'_, PyList>,
        i: usize,
        custom: &Arc<CustomType>,
        aux: &Py<PyAny>,
        index: &LeafIndex,
    ) -> PyResult<Reflatten> {
        let py = objects.py();
        let children = (def.child_indices(i)?.into_iter())
            .map(|c| Expect::of(def, objects, c, index, 0))
            .collect::<PyResult<_>>()?;
        Ok(Reflatten {
            obj: objects.get_item(i)?.unbind(),
            custom: custom.clone(),
            children,
            aux: aux.clone_ref(py),
        })
    }

    /// A copy, for a check that runs the flatten without holding the snapshot (Python code
    /// there may let another thread use the same snapshot).
    pub(super) fn clone_ref(&self, py: Python<'_>) -> Reflatten {
        Reflatten {
            obj: self.obj.clone_ref(py),
            custom: self.custom.clone(),
            children: self.children.iter().map(|c| c.clone_ref(py)).collect(),
            aux: self.aux.clone_ref(py),
        }
    }

    /// Follow a call's write-back (`Watched::follow`).
    pub(super) fn follow(&mut self, leaves: &Bound<'_, PyList>, dropped: &mut Vec<Py<PyAny>>) {
        (self.children.iter_mut()).for_each(|child| child.follow(leaves, dropped));
    }

    /// Where the node's object is held (for `Snapshot::release`).
    pub(super) fn owner_mut(&mut self) -> &mut Py<PyAny> {
        &mut self.obj
    }

    /// Whether the node's flatten, run now, gives the children recorded and equal aux data.
    /// Runs the flatten (Python code, for most): an error it raises means "flatten again",
    /// and that flatten raises it where the user sees it. `owner`: the node's object, given
    /// by the caller where the record let go of it (`Snapshot::release`).
    pub(super) fn unchanged<'py>(
        &self,
        py: Python<'py>,
        owner: Option<&Bound<'py, PyAny>>,
    ) -> bool {
        let obj = owner.unwrap_or_else(|| self.obj.bind(py));
        let Ok((children, aux)) = call_custom_flatten(obj, &self.custom) else {
            return false;
        };
        children.len() == self.children.len()
            && (children.iter().zip(&self.children)).all(|(now, expect)| expect.matches(now))
            && same_aux(&aux, self.aux.bind(py))
    }
}

/// Whether two aux data are the same: the same object, tuples of the same objects (a flatten
/// builds a new tuple each time), or equal (`==`, as JAX compares treedefs); an `==` that
/// raises or is not a bool (an array's) is a difference.
fn same_aux(now: &Bound<'_, PyAny>, then: &Bound<'_, PyAny>) -> bool {
    identical(now, then, 0) || now.eq(then).unwrap_or(false)
}

fn identical(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>, depth: usize) -> bool {
    if a.is(b) {
        return true;
    }
    match (a.cast_exact::<PyTuple>(), b.cast_exact::<PyTuple>()) {
        (Ok(x), Ok(y)) if depth < BUILT_DEPTH => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|(p, q)| identical(&p, &q, depth + 1))
        }
        _ => false,
    }
}
