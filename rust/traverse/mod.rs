//! The traversal engine: one iterative walk (no native recursion, so any depth is safe) that
//! every flatten uses. What a walk records is its `Mode`: `plain::Plain` for JAX's flatten,
//! `crate::sharing::Sharing` for the identity-tracking flatten of the alias/strict policies.
//! The walk owns what they have in common: JAX's order, the `is_leaf` rule, classification,
//! the cycle/depth guard and the key paths.

mod guard;
pub mod plain;

pub use guard::MAX_DEPTH;

use crate::node::{expand, key_entry_of, Node, NodeKind};
use crate::registry::{compat, Classifier, Kind};
use guard::{Breach, PathGuard};
use pyo3::exceptions::{PyRecursionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyTuple};

/// The pointer every message of treeclone's own ends with (`treeclone._docs.see`): the entry
/// of the documentation's errors page for a cycle or a tree nested too deep.
const CYCLIC_TREE_DOCS: &str = " (treeclone docs: errors.html#cyclic-tree)";

/// What a traversal records. The engine calls these in post-order.
pub trait Mode<'py> {
    /// A leaf at the current position (`path` is its key path when paths are recorded).
    fn leaf(&mut self, obj: Bound<'py, PyAny>, path: &[Py<PyAny>]) -> PyResult<()>;

    /// A container met: true when the mode recorded it as a reference to an earlier one, so
    /// it is not expanded again.
    fn revisit(&mut self, obj: &Bound<'py, PyAny>, kind: &Kind) -> bool;

    /// A container whose children are all recorded.
    fn node(&mut self, obj: Bound<'py, PyAny>, node: Node);

    /// `(leaf entries, node entries)` recorded so far.
    fn counts(&self) -> (usize, usize);
}

/// How a walk treats leaves chosen by the caller.
#[derive(Default)]
pub struct Options<'py> {
    pub is_leaf: Option<Bound<'py, PyAny>>,
    /// `is_leaf(path, x)` instead of `is_leaf(x)`.
    pub is_leaf_takes_path: bool,
    /// Record each leaf's key path.
    pub with_paths: bool,
    /// How errors name the tree's root (a caller's argument, say); None: "the root".
    pub root_name: Option<String>,
}

impl<'py> Options<'py> {
    pub fn plain(is_leaf: Option<Bound<'py, PyAny>>) -> Self {
        Options {
            is_leaf: is_leaf.filter(|f| !f.is_none()),
            ..Options::default()
        }
    }
}

/// A container on the path, with the children still to visit.
struct OpenNode<'py> {
    obj: Bound<'py, PyAny>,
    kind: NodeKind,
    arity: usize,
    remaining: usize,
    leaves_start: usize,
    nodes_start: usize,
}

impl OpenNode<'_> {
    /// Index of the child being visited.
    fn current_child(&self) -> usize {
        self.arity - self.remaining - 1
    }
}

/// Walk `tree`, telling `mode` what it meets.
pub fn walk<'py, M: Mode<'py>>(
    tree: &Bound<'py, PyAny>,
    opts: &Options<'py>,
    mode: &mut M,
) -> PyResult<()> {
    let py = tree.py();
    // Sized for common trees at once: growing them step by step cost more than their one
    // allocation.
    let mut frames: Vec<OpenNode<'py>> = Vec::with_capacity(8);
    // Children waiting to be visited, each frame's reversed so the next one is on top.
    let mut pending: Vec<Py<PyAny>> = Vec::with_capacity(32);
    let mut pending_keys: Vec<Py<PyAny>> = Vec::new();
    let mut path: Vec<Py<PyAny>> = Vec::new();
    let mut classifier = Classifier::new();
    let mut guard = PathGuard::default();
    let mut current = tree.clone();
    loop {
        let kind = match &opts.is_leaf {
            Some(f) if is_leaf(py, f, opts.is_leaf_takes_path, &path, &current)? => {
                classifier.python_ran();
                Kind::Leaf
            }
            Some(_) => {
                classifier.python_ran();
                classifier.classify(&current)?
            }
            None => classifier.classify(&current)?,
        };
        if let Kind::Leaf = kind {
            mode.leaf(current, &path)?;
        } else if !mode.revisit(&current, &kind) {
            let start = pending.len();
            let node = expand(
                &current,
                &kind,
                &mut pending,
                opts.with_paths.then_some(&mut pending_keys),
            )?;
            if let Kind::Custom(_) = kind {
                classifier.python_ran();
            }
            let arity = pending.len() - start;
            pending[start..].reverse();
            if opts.with_paths {
                pending_keys[start..].reverse();
            }
            if arity == 0 {
                // A leafless container closes at once: no frame, nothing to guard.
                mode.node(current, Node::childless(node));
            } else {
                open(&mut frames, &mut guard, mode, opts, current, node, arity)?;
            }
        }
        // Move to the next object to visit, closing finished frames.
        loop {
            let Some(top) = frames.last_mut() else {
                return Ok(());
            };
            if top.remaining > 0 {
                top.remaining -= 1;
                current = pending.pop().expect("pending child").into_bound(py);
                if opts.with_paths {
                    path.truncate(frames.len() - 1);
                    path.push(pending_keys.pop().expect("pending key"));
                }
                break;
            }
            let f = frames.pop().expect("a frame");
            guard.leave(f.obj.as_ptr() as usize, frames.len());
            let (leaves, nodes) = mode.counts();
            let node = Node {
                kind: f.kind,
                arity: f.arity,
                num_leaves: leaves - f.leaves_start,
                num_nodes: nodes - f.nodes_start + 1,
            };
            mode.node(f.obj, node);
        }
    }
}

/// Push a frame for `obj`, a container with `arity` children, once the guard allows it.
#[inline]
fn open<'py, M: Mode<'py>>(
    frames: &mut Vec<OpenNode<'py>>,
    guard: &mut PathGuard,
    mode: &M,
    opts: &Options<'py>,
    obj: Bound<'py, PyAny>,
    kind: NodeKind,
    arity: usize,
) -> PyResult<()> {
    let py = obj.py();
    let depth = frames.len();
    let address = obj.as_ptr() as usize;
    match guard.enter(address, depth, |d| frames[d].obj.as_ptr() as usize) {
        Ok(()) => {}
        Err(Breach::Cycle) => return Err(cycle_error(py, frames, &obj, opts)?),
        Err(Breach::TooDeep) => {
            return Err(PyRecursionError::new_err(format!(
                "pytree is nested more than {MAX_DEPTH} levels deep{CYCLIC_TREE_DOCS}"
            )))
        }
    }
    let (leaves_start, nodes_start) = mode.counts();
    frames.push(OpenNode {
        obj,
        kind,
        arity,
        remaining: arity,
        leaves_start,
        nodes_start,
    });
    Ok(())
}

/// JAX's `is_leaf` rule: True makes a leaf; False or None do not; anything else is an error.
fn is_leaf<'py>(
    py: Python<'py>,
    f: &Bound<'py, PyAny>,
    takes_path: bool,
    path: &[Py<PyAny>],
    obj: &Bound<'py, PyAny>,
) -> PyResult<bool> {
    let answer = if takes_path {
        f.call1((PyTuple::new(py, path)?, obj))?
    } else {
        f.call1((obj,))?
    };
    if answer.is(PyBool::new(py, true)) {
        Ok(true)
    } else if answer.is_none() || answer.is(PyBool::new(py, false)) {
        Ok(false)
    } else {
        Err(PyValueError::new_err(format!(
            "is_leaf predicate returned a non-boolean value {}; expected a boolean",
            answer.repr()?
        )))
    }
}

/// A ValueError naming where `obj`, met again below the open containers `path` (root first),
/// contains itself.
fn cycle_error<'py>(
    py: Python<'py>,
    path: &[OpenNode<'py>],
    obj: &Bound<'py, PyAny>,
    opts: &Options<'py>,
) -> PyResult<PyErr> {
    let occurrences: Vec<usize> = path
        .iter()
        .enumerate()
        .filter(|(_, n)| n.obj.is(obj))
        .map(|(i, _)| i)
        .collect();
    let first = occurrences.first().copied().unwrap_or(0);
    let second = occurrences.get(1).copied().unwrap_or(path.len());
    let keys = |nodes: &[OpenNode<'py>]| -> PyResult<Bound<'py, PyTuple>> {
        let mut v = Vec::with_capacity(nodes.len());
        for n in nodes {
            v.push(key_entry_of(&n.obj, &n.kind, n.current_child())?);
        }
        PyTuple::new(py, v)
    };
    let keystr = compat(py)?.keystr.bind(py);
    let to_first = keys(&path[..first])?;
    let where_first = match (&opts.root_name, to_first.is_empty()) {
        (Some(name), true) => name.clone(),
        (Some(name), false) => format!("{name}{}", keystr.call1((to_first,))?),
        (None, true) => "the root".to_string(),
        (None, false) => format!("key path {}", keystr.call1((to_first,))?),
    };
    let loop_path = keystr.call1((keys(&path[first..second])?,))?;
    Ok(PyValueError::new_err(format!(
        "cycle detected in pytree: the {} at {} contains itself at relative key path \
         {}{CYCLIC_TREE_DOCS}",
        obj.get_type().name()?,
        where_first,
        loop_path
    )))
}
