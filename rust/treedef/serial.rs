//! A treedef's outside forms: its pickle state and jaxlib's `PyTreeDef`.
//!
//! The pickle state is a list with one `(kind, arity, data, type)` tuple per node in
//! post-order, `kind` being the node kind's name (`"leaf"`, `"none"`, `"tuple"`, `"list"`,
//! `"dict"`, `"namedtuple"`, `"custom"`) and `type` the node's Python type (pickled by
//! reference). Loading checks every field, so a tampered state is a ValueError or TypeError at
//! load time, never a broken treedef.

use super::{nodes_from_parts, PyTreeDef};
use crate::node::NodeKind;
use crate::registry::{self, compat, Kind};
use pyo3::exceptions::{PyRecursionError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyType};

/// Deepest treedef `to_jax` converts: JAX builds a node by copying its children, so the cost
/// grows with depth squared; JAX's own flatten stops far shallower than this anyway.
const MAX_JAX_DEPTH: usize = 10_000;

fn kind_name(kind: &NodeKind) -> &'static str {
    match kind {
        NodeKind::Leaf => "leaf",
        NodeKind::None => "none",
        NodeKind::Tuple => "tuple",
        NodeKind::List => "list",
        NodeKind::Dict(_) => "dict",
        NodeKind::NamedTuple(_) => "namedtuple",
        NodeKind::Custom(..) => "custom",
    }
}

fn registry_kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Leaf => "leaf",
        Kind::None => "none",
        Kind::Tuple => "tuple",
        Kind::List => "list",
        Kind::Dict => "dict",
        Kind::NamedTuple => "namedtuple",
        Kind::Custom(_) => "custom",
    }
}

/// A node's kind and payload from a node type as JAX's registry classifies it today, and its
/// data in JAX's form (`node_data()`'s second item).
pub(super) fn node_kind(
    py: Python<'_>,
    ty: &Bound<'_, PyType>,
    kind: Kind,
    data: Bound<'_, PyAny>,
) -> PyResult<NodeKind> {
    Ok(match kind {
        Kind::Leaf => {
            return Err(PyTypeError::new_err(format!(
                "{} is not a pytree node type known to treeclone",
                ty.repr()?
            )))
        }
        Kind::None => NodeKind::None,
        Kind::Tuple => NodeKind::Tuple,
        Kind::List => NodeKind::List,
        Kind::Dict => {
            let keys = data.try_iter()?.collect::<PyResult<Vec<_>>>()?;
            NodeKind::Dict(PyTuple::new(py, keys)?.unbind())
        }
        Kind::NamedTuple => NodeKind::NamedTuple(ty.clone().unbind()),
        Kind::Custom(custom) => NodeKind::Custom(custom, data.unbind()),
    })
}

impl PyTreeDef {
    /// The pickle state (see the module comment).
    pub(super) fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let state = PyList::empty(py);
        for node in &self.nodes {
            let ty = match node.kind.node_type(py) {
                Some(ty) => ty.into_any(),
                None => py.None().into_bound(py),
            };
            let data = node.kind.jax_data(py);
            state.append((kind_name(&node.kind), node.arity, data, ty))?;
        }
        Ok(state)
    }
}

/// Inverse of `PyTreeDef.__reduce__`.
#[pyfunction]
pub fn _treedef_from_state(py: Python<'_>, state: &Bound<'_, PyList>) -> PyResult<PyTreeDef> {
    let mut parts = Vec::with_capacity(state.len());
    for item in state.iter() {
        let (name, arity, data, ty): (String, usize, Bound<'_, PyAny>, Bound<'_, PyAny>) =
            item.extract().map_err(|_| {
                PyValueError::new_err(
                    "cannot unpickle treedef: each node must be (kind, arity, data, type)",
                )
            })?;
        if name == "leaf" {
            parts.push((NodeKind::Leaf, arity));
            continue;
        }
        let ty = ty.cast_into::<PyType>().map_err(|_| {
            PyTypeError::new_err("cannot unpickle treedef: a node's type is not a type")
        })?;
        let kind = registry::kind_for_type(py, &ty)?;
        if registry_kind_name(&kind) != name {
            return Err(PyValueError::new_err(format!(
                "cannot unpickle treedef: {} is no longer registered as a {name} node",
                ty.repr()?
            )));
        }
        parts.push((node_kind(py, &ty, kind, data)?, arity));
    }
    Ok(PyTreeDef::new(nodes_from_parts(py, parts)?))
}

/// The equal jaxlib `PyTreeDef`.
pub fn to_jax<'py>(py: Python<'py>, def: &PyTreeDef) -> PyResult<Bound<'py, PyAny>> {
    let depth = depth(def);
    if depth > MAX_JAX_DEPTH {
        return Err(PyRecursionError::new_err(format!(
            "to_jax: this treedef is nested {depth} levels deep; more than {MAX_JAX_DEPTH} \
             cannot be converted to a JAX treedef"
        )));
    }
    let make = compat(py)?.to_jax_node.bind(py);
    let mut stack: Vec<Bound<'py, PyAny>> = Vec::new();
    for node in &def.nodes {
        let children = PyList::new(py, stack.drain(stack.len() - node.arity..))?;
        let node_data = match node.jax_node_data(py)? {
            Some(t) => t.into_any(),
            None => py.None().into_bound(py),
        };
        stack.push(make.call1((node_data, children))?);
    }
    Ok(stack.pop().expect("one root"))
}

/// Levels from the root to the deepest leaf.
fn depth(def: &PyTreeDef) -> usize {
    let mut depths: Vec<usize> = Vec::new();
    for node in &def.nodes {
        let below = depths.drain(depths.len() - node.arity..).max().unwrap_or(0);
        depths.push(below + 1);
    }
    depths.pop().unwrap_or(0)
}

/// Convert a jaxlib `PyTreeDef`.
pub fn from_jax(py: Python<'_>, treedef: &Bound<'_, PyAny>) -> PyResult<PyTreeDef> {
    // Explicit stack: (jax treedef, children already pushed?)
    let mut parts = Vec::new();
    let mut work: Vec<(Bound<'_, PyAny>, bool)> = vec![(treedef.clone(), false)];
    while let Some((td, expanded)) = work.pop() {
        let node_data = td.call_method0("node_data")?;
        if node_data.is_none() {
            parts.push((NodeKind::Leaf, 0));
            continue;
        }
        let children = td.call_method0("children")?.cast_into::<PyList>()?;
        if !expanded {
            work.push((td, true));
            for child in children.iter().rev() {
                work.push((child, false));
            }
            continue;
        }
        let (ty, data): (Bound<'_, PyType>, Bound<'_, PyAny>) = node_data.extract()?;
        let kind = registry::kind_for_type(py, &ty)?;
        parts.push((node_kind(py, &ty, kind, data)?, children.len()));
    }
    // `work` is LIFO with children pushed reversed, so parts came out in post-order.
    Ok(PyTreeDef::new(nodes_from_parts(py, parts)?))
}
