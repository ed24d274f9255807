//! JAX's flatten: every leaf in order, every container a node.

use super::{walk, Mode, Options};
use crate::node::{DictOrder, Node};
use crate::registry::Kind;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// A flattened tree: its leaves (with their key paths when asked for) and its nodes.
#[derive(Default)]
pub struct Flattened<'py> {
    pub leaves: Vec<Bound<'py, PyAny>>,
    pub paths: Vec<Bound<'py, PyTuple>>,
    pub nodes: Vec<Node>,
    with_paths: bool,
}

impl<'py> Mode<'py> for Flattened<'py> {
    const DICT_ORDER: DictOrder = DictOrder::Sorted;

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
