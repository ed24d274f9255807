//! Flatten a pytree into its leaves and treedef, iteratively (no native recursion, so any
//! depth is safe), with JAX's exact order and node semantics.

use crate::keysort;
use crate::registry::{self, compat, CustomType, Kind};
use crate::treedef::Node;
use pyo3::exceptions::{PyRecursionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::collections::HashSet;

/// A tree deeper than this is refused with RecursionError rather than exhausting memory
/// (e.g. a custom node that makes a fresh child node every time it is flattened).
pub(crate) const MAX_DEPTH: usize = 1_000_000;

/// From this depth on, the containers on the path are also kept in a set, so that a cycle the
/// anchor check misses (one through fresh containers, where only every k-th object on the path
/// repeats) is still caught, by this depth plus its length.
const EXACT_CYCLE_DEPTH: usize = 10_000;

pub struct Options<'py> {
    pub is_leaf: Option<Bound<'py, PyAny>>,
    /// `is_leaf(path, x)` instead of `is_leaf(x)`.
    pub is_leaf_takes_path: bool,
    /// Record each leaf's key path.
    pub with_paths: bool,
}

impl<'py> Options<'py> {
    pub fn plain(is_leaf: Option<Bound<'py, PyAny>>) -> Self {
        Options {
            is_leaf: is_leaf.filter(|f| !f.is_none()),
            is_leaf_takes_path: false,
            with_paths: false,
        }
    }
}

pub struct Flattened<'py> {
    pub leaves: Vec<Bound<'py, PyAny>>,
    pub paths: Vec<Bound<'py, PyTuple>>,
    pub nodes: Vec<Node>,
}

/// A container on the traversal's path, with the children still to visit.
pub(crate) struct OpenNode<'py> {
    pub obj: Bound<'py, PyAny>,
    pub kind: Kind,
    pub data: Option<Py<PyAny>>,
    pub arity: usize,
    pub remaining: usize,
}

impl OpenNode<'_> {
    /// Index of the child being visited.
    fn current_child(&self) -> usize {
        self.arity - self.remaining - 1
    }
}

struct Frame<'py> {
    node: OpenNode<'py>,
    leaves_start: usize,
    nodes_start: usize,
}

/// Call a custom node's flatten function and check its result as JAX does.
pub fn call_custom_flatten<'py>(
    obj: &Bound<'py, PyAny>,
    custom: &CustomType,
) -> PyResult<(Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>)> {
    let out = custom.flatten.bind(obj.py()).call1((obj,))?;
    let pair = match out.cast::<PyTuple>() {
        Ok(t) if t.len() == 2 => t.clone(),
        _ => {
            return Err(PyValueError::new_err(format!(
                "The to_iterable function for a custom PyTree node should return a \
                 (children, aux_data) tuple, got {}",
                out.repr()?
            )))
        }
    };
    let children = pair.get_item(0)?;
    let iter = children.try_iter().map_err(|_| match pair.repr() {
        Ok(r) => PyValueError::new_err(format!(
            "The to_iterable function for a custom PyTree node should return a \
             (children, aux_data) tuple where 'children' is iterable, got {r}"
        )),
        Err(e) => e,
    })?;
    let children = iter.collect::<PyResult<Vec<_>>>()?;
    Ok((children, pair.get_item(1)?))
}

/// Custom node children with their keys, through JAX's own keyed flatten.
fn custom_flatten_with_keys<'py>(
    obj: &Bound<'py, PyAny>,
    children: &mut Vec<Py<PyAny>>,
    keys: &mut Vec<Py<PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let out = compat(py)?
        .flatten_one_level_with_keys
        .bind(py)
        .call1((obj,))?;
    let (pairs, aux): (Bound<'py, PyAny>, Bound<'py, PyAny>) = out.extract()?;
    for pair in pairs.try_iter()? {
        let (key, child): (Bound<'py, PyAny>, Bound<'py, PyAny>) = pair?.extract()?;
        keys.push(key.unbind());
        children.push(child.unbind());
    }
    Ok(aux)
}

/// Push `obj`'s children (in order) onto `children` and return the node's data.
#[inline(always)] // the hot path of flatten; also called by flatten_shared
pub(crate) fn expand<'py>(
    obj: &Bound<'py, PyAny>,
    kind: &Kind,
    children: &mut Vec<Py<PyAny>>,
    keys: Option<&mut Vec<Py<PyAny>>>,
) -> PyResult<Option<Py<PyAny>>> {
    let py = obj.py();
    let start = children.len();
    let data = match kind {
        Kind::Leaf | Kind::None => None,
        Kind::Tuple => {
            // SAFETY: `classify` returned Tuple only for an exact tuple.
            let t = unsafe { obj.cast_unchecked::<PyTuple>() };
            children.extend(t.iter_borrowed().map(|x| x.to_owned().unbind()));
            None
        }
        Kind::List => {
            // SAFETY: `classify` returned List only for an exact list.
            let l = unsafe { obj.cast_unchecked::<PyList>() };
            children.extend(l.iter().map(Bound::unbind));
            None
        }
        Kind::Dict => {
            // SAFETY: `classify` returned Dict only for an exact dict.
            let d = unsafe { obj.cast_unchecked::<PyDict>() };
            Some(keysort::sorted_children(py, d, children)?.into_any())
        }
        Kind::NamedTuple => {
            let t = obj.cast::<PyTuple>()?;
            children.extend(t.iter_borrowed().map(|x| x.to_owned().unbind()));
            Some(obj.get_type().into_any().unbind())
        }
        Kind::Custom(custom) => {
            if let Some(keys) = keys {
                let aux = custom_flatten_with_keys(obj, children, keys)?;
                return Ok(Some(aux.unbind()));
            }
            let (kids, aux) = call_custom_flatten(obj, custom)?;
            children.extend(kids.into_iter().map(Bound::unbind));
            Some(aux.unbind())
        }
    };
    if let Some(keys) = keys {
        let n = children.len() - start;
        for i in 0..n {
            keys.push(key_entry(py, kind, data.as_ref(), obj, i)?.unbind());
        }
    }
    Ok(data)
}

/// JAX's key entry for child `i` of a node.
pub(crate) fn key_entry<'py>(
    py: Python<'py>,
    kind: &Kind,
    data: Option<&Py<PyAny>>,
    obj: &Bound<'py, PyAny>,
    i: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let c = compat(py)?;
    match kind {
        Kind::Tuple | Kind::List => c.sequence_key.bind(py).call1((i,)),
        Kind::Dict => {
            let keys = data.expect("dict keys").bind(py).cast::<PyTuple>()?.clone();
            c.dict_key.bind(py).call1((keys.get_item(i)?,))
        }
        Kind::NamedTuple => {
            let fields = obj.get_type().getattr("_fields")?;
            if i >= fields.len()? {
                return Err(PyValueError::new_err(
                    "A namedtuple's _fields attribute should have the same size as the tuple.",
                ));
            }
            c.getattr_key.bind(py).call1((fields.get_item(i)?,))
        }
        _ => c.flattened_index_key.bind(py).call1((i,)),
    }
}

/// Flatten `tree`.
pub fn flatten<'py>(tree: &Bound<'py, PyAny>, opts: &Options<'py>) -> PyResult<Flattened<'py>> {
    let py = tree.py();
    let mut out = Flattened {
        leaves: Vec::new(),
        paths: Vec::new(),
        nodes: Vec::new(),
    };
    let mut frames: Vec<Frame<'py>> = Vec::new();
    // Children waiting to be visited, each frame's reversed so the next one is on top.
    let mut pending: Vec<Py<PyAny>> = Vec::new();
    let mut pending_keys: Vec<Py<PyAny>> = Vec::new();
    let mut path: Vec<Py<PyAny>> = Vec::new();
    let mut classifier = registry::Classifier::new();
    // Addresses of the containers on the path while it is EXACT_CYCLE_DEPTH or more deep.
    let mut on_path: Option<HashSet<usize>> = None;
    let mut current = tree.clone();
    loop {
        let forced_leaf = match &opts.is_leaf {
            None => false,
            Some(f) => {
                let answer = if opts.is_leaf_takes_path {
                    f.call1((PyTuple::new(py, path.iter())?, &current))?
                } else {
                    f.call1((&current,))?
                };
                if answer.is(&*pyo3::types::PyBool::new(py, true)) {
                    true
                } else if answer.is_none() || answer.is(&*pyo3::types::PyBool::new(py, false)) {
                    false
                } else {
                    return Err(PyValueError::new_err(format!(
                        "is_leaf predicate returned a non-boolean value {}; expected a boolean",
                        answer.repr()?
                    )));
                }
            }
        };
        if opts.is_leaf.is_some() {
            classifier.python_ran();
        }
        let kind = if forced_leaf {
            Kind::Leaf
        } else {
            classifier.classify(&current)?
        };
        if let Kind::Leaf = kind {
            out.nodes.push(Node::leaf());
            if opts.with_paths {
                out.paths.push(PyTuple::new(py, path.iter())?);
            }
            out.leaves.push(current);
        } else {
            let start = pending.len();
            let data = expand(
                &current,
                &kind,
                &mut pending,
                opts.with_paths.then_some(&mut pending_keys),
            )?;
            if let Kind::Custom(_) = kind {
                classifier.python_ran();
            }
            let arity = pending.len() - start;
            if arity == 0 {
                out.nodes.push(Node {
                    kind,
                    arity: 0,
                    num_leaves: 0,
                    num_nodes: 1,
                    data,
                });
            } else {
                pending[start..].reverse();
                if opts.with_paths {
                    pending_keys[start..].reverse();
                }
                let depth = frames.len();
                // Cycle check, Brent's way: compare with the container on the path at the
                // largest power-of-two depth not above this one. A container that contains
                // itself makes the path periodic, and the period is found within a few
                // multiples of (its start + its length) levels, at one comparison per level.
                if let Some(anchor) = cycle_anchor(depth) {
                    if frames[anchor].node.obj.is(&current) {
                        return Err(cycle_error(py, &open_nodes(&frames), &current)?);
                    }
                }
                if depth >= EXACT_CYCLE_DEPTH {
                    let set = on_path.get_or_insert_with(|| {
                        frames
                            .iter()
                            .map(|f| f.node.obj.as_ptr() as usize)
                            .collect()
                    });
                    if !set.insert(current.as_ptr() as usize) {
                        return Err(cycle_error(py, &open_nodes(&frames), &current)?);
                    }
                }
                if depth >= MAX_DEPTH {
                    return Err(PyRecursionError::new_err(format!(
                        "pytree is nested more than {MAX_DEPTH} levels deep"
                    )));
                }
                frames.push(Frame {
                    node: OpenNode {
                        obj: current,
                        kind,
                        data,
                        arity,
                        remaining: arity,
                    },
                    leaves_start: out.leaves.len(),
                    nodes_start: out.nodes.len(),
                });
            }
        }
        // Move to the next object to visit, closing finished frames.
        loop {
            let Some(top) = frames.last_mut() else {
                return Ok(out);
            };
            if top.node.remaining > 0 {
                top.node.remaining -= 1;
                current = pending.pop().expect("pending child").into_bound(py);
                if opts.with_paths {
                    path.truncate(frames.len() - 1);
                    path.push(pending_keys.pop().expect("pending key"));
                }
                break;
            }
            let f = frames.pop().expect("a frame");
            let depth = frames.len();
            if depth + 1 >= EXACT_CYCLE_DEPTH {
                // Deep frames leave the set one by one; back above the threshold, it is dropped
                // (and rebuilt from the path if this traversal goes that deep again).
                match on_path.as_mut() {
                    Some(set) if depth >= EXACT_CYCLE_DEPTH => {
                        set.remove(&(f.node.obj.as_ptr() as usize));
                    }
                    _ => on_path = None,
                }
            }
            out.nodes.push(Node {
                kind: f.node.kind,
                arity: f.node.arity,
                num_leaves: out.leaves.len() - f.leaves_start,
                num_nodes: out.nodes.len() - f.nodes_start + 1,
                data: f.node.data,
            });
        }
    }
}

/// The depth of the container a new container at `depth` is compared with: the largest power
/// of two below `depth` (None when `depth` is itself a power of two, or 0).
fn cycle_anchor(depth: usize) -> Option<usize> {
    if depth == 0 || depth.is_power_of_two() {
        return None;
    }
    Some(1usize << (usize::BITS - 1 - depth.leading_zeros()))
}

fn open_nodes<'a, 'py>(frames: &'a [Frame<'py>]) -> Vec<&'a OpenNode<'py>> {
    frames.iter().map(|f| &f.node).collect()
}

/// A ValueError naming where `obj`, met again on `path` (root first), contains itself.
pub(crate) fn cycle_error<'py>(
    py: Python<'py>,
    path: &[&OpenNode<'py>],
    obj: &Bound<'py, PyAny>,
) -> PyResult<PyErr> {
    let occurrences: Vec<usize> = path
        .iter()
        .enumerate()
        .filter(|(_, n)| n.obj.is(obj))
        .map(|(i, _)| i)
        .collect();
    let first = occurrences[0];
    let second = occurrences.get(1).copied().unwrap_or(path.len());
    let keys = |nodes: &[&OpenNode<'py>]| -> PyResult<Bound<'py, PyTuple>> {
        let mut v = Vec::with_capacity(nodes.len());
        for n in nodes {
            v.push(key_entry(
                py,
                &n.kind,
                n.data.as_ref(),
                &n.obj,
                n.current_child(),
            )?);
        }
        PyTuple::new(py, v)
    };
    let keystr = compat(py)?.keystr.bind(py);
    let to_first = keys(&path[..first])?;
    let where_first = if to_first.is_empty() {
        "the root".to_string()
    } else {
        format!("key path {}", keystr.call1((to_first,))?)
    };
    let loop_path = keystr.call1((keys(&path[first..second])?,))?;
    Ok(PyValueError::new_err(format!(
        "cycle detected in pytree: the {} at {} contains itself at relative key path {}",
        obj.get_type().name()?,
        where_first,
        loop_path
    )))
}

#[cfg(test)]
mod tests {
    use super::cycle_anchor;

    #[test]
    fn anchor_is_the_previous_power_of_two() {
        assert_eq!(cycle_anchor(0), None);
        assert_eq!(cycle_anchor(1), None);
        assert_eq!(cycle_anchor(2), None);
        assert_eq!(cycle_anchor(3), Some(2));
        assert_eq!(cycle_anchor(5), Some(4));
        assert_eq!(cycle_anchor(7), Some(4));
        assert_eq!(cycle_anchor(8), None);
        assert_eq!(cycle_anchor(1000), Some(512));
    }

    /// Simulate a path that enters a cycle of length `period` at depth `start`: the anchor
    /// scheme must meet a repeated container within a bounded number of levels.
    #[test]
    fn every_periodic_path_is_caught() {
        for start in 0..70 {
            for period in 1..70 {
                let at = |d: usize| {
                    if d < start {
                        1000 + d
                    } else {
                        (d - start) % period
                    }
                };
                let found = (0..10_000).find(|&d| cycle_anchor(d).is_some_and(|a| at(a) == at(d)));
                let d = found.expect("cycle detected");
                assert!(
                    d <= 4 * (start + period) + 4,
                    "start {start} period {period}: {d}"
                );
            }
        }
    }
}
