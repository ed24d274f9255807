//! JAX's flatten: every leaf in order, every container a node.

use super::{walk, Mode, Options};
use crate::node::{call_custom_flatten, known, Node};
use crate::registry::{Classifier, Kind};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PyTuple};

/// A flattened tree: its leaves (with their key paths when asked for) and its nodes.
#[derive(Default)]
pub struct Flattened<'py> {
    pub leaves: Vec<Bound<'py, PyAny>>,
    pub paths: Vec<Bound<'py, PyTuple>>,
    pub nodes: Vec<Node>,
    with_paths: bool,
}

impl<'py> Mode<'py> for Flattened<'py> {
    #[inline]
    fn leaf(&mut self, obj: Bound<'py, PyAny>, path: &[Py<PyAny>]) -> PyResult<()> {
        if self.with_paths {
            self.paths.push(PyTuple::new(obj.py(), path)?);
        }
        self.nodes.push(Node::leaf());
        self.leaves.push(obj);
        Ok(())
    }

    #[inline]
    fn revisit(&mut self, _: &Bound<'py, PyAny>, _: &Kind) -> bool {
        false
    }

    #[inline]
    fn node(&mut self, _: Bound<'py, PyAny>, node: Node) {
        self.nodes.push(node);
    }

    #[inline]
    fn counts(&self) -> (usize, usize) {
        (self.leaves.len(), self.nodes.len())
    }
}

/// Flatten `tree` as `jax.tree_util.tree_flatten` (with key paths if `opts` asks).
pub fn flatten<'py>(tree: &Bound<'py, PyAny>, opts: &Options<'py>) -> PyResult<Flattened<'py>> {
    let mut out = Flattened {
        with_paths: opts.with_paths,
        ..Flattened::default()
    };
    walk(tree, opts, &mut out)?;
    Ok(out)
}

/// Records nothing: a walk for its checks alone (cycles, and JAX's rules on what flatten
/// functions return).
struct Unrecorded;

impl<'py> Mode<'py> for Unrecorded {
    // JAX's order, as flatten's: a cycle's message names keys by their place in it.

    #[inline]
    fn leaf(&mut self, _: Bound<'py, PyAny>, _: &[Py<PyAny>]) -> PyResult<()> {
        Ok(())
    }

    #[inline]
    fn revisit(&mut self, _: &Bound<'py, PyAny>, _: &Kind) -> bool {
        false
    }

    #[inline]
    fn node(&mut self, _: Bound<'py, PyAny>, _: Node) {}

    #[inline]
    fn counts(&self) -> (usize, usize) {
        (0, 0)
    }
}

/// Raise what `flatten(tree)` would raise on a cycle or a bad flatten result, recording
/// nothing. Trees less than `QUICK_DEPTH` containers deep (all but cyclic or very deep ones)
/// are only looked through; the others are walked again as `flatten` walks them, to find and
/// name the cycle.
pub fn check<'py>(tree: &Bound<'py, PyAny>, opts: &Options<'py>) -> PyResult<()> {
    if shallow(tree, &mut Classifier::new())? {
        return Ok(());
    }
    walk(tree, opts, &mut Unrecorded)
}

/// Raise what `check((args, kwargs))` would raise, the static arguments left out as JAX's
/// `jit` and `checkpoint` leave them (hashed, never flattened): a position `i` of `args` that
/// `static_nums` holds as `i` or, counted from the end, as `i - len(args)`, and a keyword that
/// `static_names` holds. The arguments left are looked through as one tuple.
pub fn check_arguments<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    static_nums: &Bound<'py, PyFrozenSet>,
    static_names: &Bound<'py, PyFrozenSet>,
) -> PyResult<()> {
    let kwargs = kwargs.filter(|kwargs| !kwargs.is_empty()); // an empty dict holds no cycle
    let n = args.len() as isize;
    let is_static = |i: isize| -> PyResult<bool> {
        Ok(!static_nums.is_empty() && (static_nums.contains(i)? || static_nums.contains(i - n)?))
    };
    if kwargs.is_none() && only_leaves(args, is_static)? {
        return Ok(()); // the usual call: arrays and scalars hold no cycle
    }
    let mut dynamic: Vec<Bound<'py, PyAny>> = Vec::with_capacity(args.len() + 1);
    if static_nums.is_empty() {
        dynamic.push(args.clone().into_any());
    } else {
        for (i, arg) in (0..n).zip(args.iter()) {
            if !is_static(i)? {
                dynamic.push(arg);
            }
        }
    }
    if let Some(kwargs) = kwargs {
        if static_names.is_empty() {
            dynamic.push(kwargs.clone().into_any());
        } else {
            // The items are copied out first: a keyword's `__eq__` (a `str` subclass's) runs
            // Python.
            for item in kwargs.items().iter() {
                let (key, value) = item.extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()?;
                if !static_names.contains(key)? {
                    dynamic.push(value);
                }
            }
        }
    }
    let dynamic = PyTuple::new(args.py(), dynamic)?;
    check(dynamic.as_any(), &Options::default())
}

/// Whether every positional argument that is not static is a leaf (or None).
fn only_leaves<'py>(
    args: &Bound<'py, PyTuple>,
    is_static: impl Fn(isize) -> PyResult<bool>,
) -> PyResult<bool> {
    let mut classifier = Classifier::new();
    for (i, arg) in args.iter().enumerate() {
        if !is_static(i as isize)? && !matches!(classifier.classify(&arg)?, Kind::Leaf | Kind::None)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Depth to which `shallow` looks.
const QUICK_DEPTH: usize = 64;

/// Whether `tree` is a pytree less than `QUICK_DEPTH` containers deep (so without a cycle).
/// Containers wait on one stack with their kind and depth (leaves are dropped when met), each
/// held by a strong reference: a flatten function, a classification, or a finalizer run by an
/// allocation may run Python code that changes any container meanwhile, so a dict's values are
/// copied out before any of them is classified.
fn shallow<'py>(tree: &Bound<'py, PyAny>, classifier: &mut Classifier<'py>) -> PyResult<bool> {
    let mut stack: Vec<(Bound<'py, PyAny>, Kind, usize)> = Vec::with_capacity(16);
    let mut children: Vec<Bound<'py, PyAny>> = Vec::new();
    children.push(tree.clone());
    let mut below = 0;
    loop {
        for child in children.drain(..) {
            let kind = classifier.classify(&child)?;
            if !matches!(kind, Kind::Leaf | Kind::None) {
                stack.push((child, kind, below));
            }
        }
        let Some((obj, kind, depth)) = stack.pop() else {
            return Ok(true);
        };
        if depth == QUICK_DEPTH {
            return Ok(false);
        }
        below = depth + 1;
        match kind {
            Kind::Tuple | Kind::NamedTuple => children.extend(obj.cast::<PyTuple>()?.iter()),
            Kind::List => children.extend(obj.cast::<PyList>()?.iter()),
            // Increfs and Rust pushes only: no Python code runs while the dict is iterated.
            Kind::Dict => children.extend(obj.cast::<PyDict>()?.iter().map(|(_, c)| c)),
            Kind::Custom(custom) => {
                // Only the children matter here, not their order: for flax nnx's nodes,
                // without the sorting and aux data of their flatten.
                children = match known::children(&obj, &custom) {
                    Some(found) => found,
                    None => call_custom_flatten(&obj, &custom)?.0,
                };
                classifier.python_ran();
            }
            Kind::Leaf | Kind::None => {}
        }
    }
}
