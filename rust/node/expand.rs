//! Taking a node apart: its children (and their JAX key entries) and its payload.

use super::{known, NodeKind};
use crate::keys::order;
use crate::registry::{compat, CustomType, Kind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// A custom node's children and aux data: from its flatten function, or from the native
/// version of a function treeclone knows (`known`), which returns the same.
pub fn call_custom_flatten<'py>(
    obj: &Bound<'py, PyAny>,
    custom: &CustomType,
) -> PyResult<(Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>)> {
    match known::flatten(obj, custom, || python_flatten(obj, custom))? {
        Some(flat) => Ok(flat),
        None => python_flatten(obj, custom),
    }
}

/// Call a custom node's flatten function and check its result as JAX does.
fn python_flatten<'py>(
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

/// Push `obj`'s children (in order) onto `children`, and their key entries onto `keys` when
/// given, and return the node's kind with its payload. `kind` is `obj`'s classification; the
/// casts below still check the type, so a wrong `kind` is an error, never undefined behaviour.
#[inline(always)] // the hot path of every traversal
pub fn expand<'py>(
    obj: &Bound<'py, PyAny>,
    kind: &Kind,
    children: &mut Vec<Py<PyAny>>,
    keys: Option<&mut Vec<Py<PyAny>>>,
) -> PyResult<NodeKind> {
    let py = obj.py();
    let start = children.len();
    let node = match kind {
        Kind::Leaf => NodeKind::Leaf,
        Kind::None => NodeKind::None,
        Kind::Tuple => {
            let t = obj.cast_exact::<PyTuple>()?;
            children.extend(t.iter_borrowed().map(|x| x.to_owned().unbind()));
            NodeKind::Tuple
        }
        Kind::List => {
            // The iterator reads each item with a bounds check and a strong reference, so a
            // list changed by Python code meanwhile cannot be read out of bounds.
            let l = obj.cast_exact::<PyList>()?;
            children.extend(l.iter().map(Bound::unbind));
            NodeKind::List
        }
        Kind::Dict => {
            let d = obj.cast_exact::<PyDict>()?;
            NodeKind::Dict(order::sorted_children(py, d, children)?)
        }
        Kind::NamedTuple => {
            let t = obj.cast::<PyTuple>()?;
            children.extend(t.iter_borrowed().map(|x| x.to_owned().unbind()));
            NodeKind::NamedTuple(obj.get_type().unbind())
        }
        Kind::Custom(custom) => {
            let aux = match keys {
                Some(keys) => {
                    return custom_flatten_with_keys(obj, children, keys)
                        .map(|aux| NodeKind::Custom(custom.clone(), aux.unbind()))
                }
                None => {
                    let (kids, aux) = call_custom_flatten(obj, custom)?;
                    children.extend(kids.into_iter().map(Bound::unbind));
                    aux
                }
            };
            NodeKind::Custom(custom.clone(), aux.unbind())
        }
    };
    if let Some(keys) = keys {
        for i in 0..children.len() - start {
            keys.push(key_entry(py, &node, i)?.unbind());
        }
    }
    Ok(node)
}

/// JAX's key entry for child `i` of `obj`, a node of kind `node`. A custom node's comes from
/// JAX's own keyed flatten of it, run again: for error messages, not traversals.
pub fn key_entry_of<'py>(
    obj: &Bound<'py, PyAny>,
    node: &NodeKind,
    i: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    if let NodeKind::Custom(..) = node {
        let (mut children, mut keys) = (Vec::new(), Vec::new());
        custom_flatten_with_keys(obj, &mut children, &mut keys)?;
        if let Some(key) = keys.get(i) {
            return Ok(key.bind(py).clone());
        }
    }
    key_entry(py, node, i)
}

/// JAX's key entry for child `i` of a node.
pub fn key_entry<'py>(py: Python<'py>, node: &NodeKind, i: usize) -> PyResult<Bound<'py, PyAny>> {
    let c = compat(py)?;
    match node {
        NodeKind::Tuple | NodeKind::List => c.sequence_key.bind(py).call1((i,)),
        NodeKind::Dict(keys) => c.dict_key.bind(py).call1((keys.bind(py).get_item(i)?,)),
        NodeKind::NamedTuple(ty) => {
            let fields = ty.bind(py).getattr("_fields")?;
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
