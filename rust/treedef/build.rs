//! The two walks a treedef guides: unflatten (build a tree from leaves) and flatten_up_to
//! (take a tree apart down to this structure's leaves).

use super::{leaf_count_error, PyTreeDef};
use crate::node::{build_node, call_custom_flatten, new_sequence, NodeKind};
use crate::registry::CustomType;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use pyo3::PyTypeInfo;

impl PyTreeDef {
    /// Rebuild a tree from owned leaves.
    pub fn unflatten_vec<'py>(
        &self,
        py: Python<'py>,
        leaves: Vec<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let expected = self.root().num_leaves;
        if leaves.len() != expected {
            return Err(leaf_count_error(expected, leaves.len()));
        }
        let mut leaves = leaves.into_iter();
        self.build(py, |_| Ok(leaves.next().expect("counted").into_bound(py)))
    }

    /// Rebuild a tree, taking the i-th leaf from `leaf(i)`.
    pub(super) fn build<'py>(
        &self,
        py: Python<'py>,
        mut leaf: impl FnMut(usize) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // A deep tree keeps most of its nodes on the stack at once (a nested list: every
        // leaf before the innermost list closes): sized once, never grown.
        let mut stack: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.nodes.len());
        let mut next_leaf = 0;
        for node in &self.nodes {
            let obj = match &node.kind {
                NodeKind::Leaf => {
                    next_leaf += 1;
                    leaf(next_leaf - 1)?
                }
                // Lists and tuples, most of the nodes of many trees, without the second
                // dispatch of `build_node`.
                NodeKind::List | NodeKind::Tuple => {
                    let start = stack.len() - node.arity;
                    let list = matches!(node.kind, NodeKind::List);
                    new_sequence(py, list, stack.drain(start..))?
                }
                kind => {
                    let start = stack.len() - node.arity;
                    build_node(py, kind, stack.drain(start..))?
                }
            };
            stack.push(obj);
        }
        Ok(stack.pop().expect("one root"))
    }

    /// Leaves of `tree` up to this structure: each leaf here matches a whole subtree there.
    pub fn flatten_up_to_vec<'py>(
        &self,
        tree: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let py = tree.py();
        let mut leaves: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.root().num_leaves);
        // Walk the post-order nodes backwards: a pre-order walk visiting children right to left.
        let mut agenda: Vec<Bound<'py, PyAny>> = vec![tree.clone()];
        for node in self.nodes.iter().rev() {
            let obj = agenda.pop().expect("agenda matches the treedef");
            match &node.kind {
                NodeKind::Leaf => {
                    leaves.push(obj);
                    continue;
                }
                NodeKind::None => {
                    if !obj.is_none() {
                        return Err(PyValueError::new_err(format!(
                            "Expected None, got {}.",
                            obj.repr()?
                        )));
                    }
                }
                NodeKind::Tuple => {
                    let t = exact::<PyTuple>(&obj, "tuple")?;
                    check_arity("Tuple", node.arity, t.len(), &obj)?;
                    agenda.extend(t.iter());
                }
                NodeKind::List => {
                    let l = exact::<PyList>(&obj, "list")?;
                    check_arity("List", node.arity, l.len(), &obj)?;
                    agenda.extend(l.iter());
                }
                NodeKind::Dict(keys) => dict_values(&obj, keys.bind(py), &mut agenda)?,
                NodeKind::NamedTuple(ty) => {
                    named_tuple_items(&obj, ty.bind(py), node.arity, &mut agenda)?
                }
                NodeKind::Custom(custom, aux) => {
                    let aux = aux.bind(py);
                    custom_children(&obj, custom, aux, node.arity, &mut agenda)?
                }
            }
        }
        leaves.reverse();
        Ok(leaves)
    }
}

/// Push the values of the dict `obj` under `keys` (this structure's, in child order: one a
/// child, as `nodes_from_parts` checks) onto `agenda`.
fn dict_values<'py>(
    obj: &Bound<'py, PyAny>,
    keys: &Bound<'py, PyTuple>,
    agenda: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    let d = exact::<PyDict>(obj, "dict")?;
    let mismatch = || -> PyResult<PyErr> {
        let present = d.keys();
        present.sort().ok();
        Ok(PyValueError::new_err(format!(
            "Dict key mismatch; expected keys: {}; present keys: {}.",
            keys.to_list().repr()?,
            present.repr()?
        )))
    };
    if d.len() != keys.len() {
        return Err(mismatch()?);
    }
    for key in keys.iter() {
        match d.get_item(&key)? {
            Some(v) => agenda.push(v),
            None => return Err(mismatch()?),
        }
    }
    Ok(())
}

/// Push the items of the namedtuple `obj`, of type `ty`, onto `agenda`: jaxlib's checks, in
/// its order and with its texts (a tuple with `_fields`, then the arity, then the type).
fn named_tuple_items<'py>(
    obj: &Bound<'py, PyAny>,
    ty: &Bound<'py, PyType>,
    arity: usize,
    agenda: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    let py = obj.py();
    let t = match obj.cast::<PyTuple>() {
        Ok(t) if obj.hasattr(intern!(py, "_fields"))? => t.clone(),
        _ => {
            return Err(PyValueError::new_err(format!(
                "Expected named tuple, got {}.",
                obj.repr()?
            )))
        }
    };
    if t.len() != arity {
        return Err(PyValueError::new_err(format!(
            "Named tuple arity mismatch: {} != {}; tuple: {}.",
            t.len(),
            arity,
            obj.repr()?
        )));
    }
    if !obj.get_type().is(ty) {
        return Err(PyValueError::new_err(format!(
            "Named tuple type mismatch: expected type: {}, tuple: {}.",
            ty.repr()?,
            obj.repr()?
        )));
    }
    agenda.extend(t.iter());
    Ok(())
}

/// Push the children of `obj`, a node of the registered type `custom` whose aux data must
/// match `expected_aux`, onto `agenda`.
fn custom_children<'py>(
    obj: &Bound<'py, PyAny>,
    custom: &CustomType,
    expected_aux: &Bound<'py, PyAny>,
    arity: usize,
    agenda: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    let ty = custom.ty.bind(obj.py());
    if !obj.get_type().is(ty) {
        return Err(PyValueError::new_err(format!(
            "Custom node type mismatch; expected type: {}; value: {}.",
            ty.repr()?,
            obj.repr()?
        )));
    }
    let (children, aux) = call_custom_flatten(obj, custom)?;
    // Identity first, as JAX: the same aux object always matches itself (even an array, or
    // NaN).
    if !aux.is(expected_aux) && !aux.eq(expected_aux)? {
        return Err(PyValueError::new_err(format!(
            "Mismatch custom node data: {} != {}; value: {}.",
            expected_aux.repr()?,
            aux.repr()?,
            obj.repr()?
        )));
    }
    check_arity("Custom node", arity, children.len(), obj)?;
    agenda.extend(children);
    Ok(())
}

/// `obj` as exactly a `T` (not a subclass, as jaxlib checks), else jaxlib's error naming
/// `what` was expected.
fn exact<'a, 'py, T: PyTypeInfo>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
) -> PyResult<&'a Bound<'py, T>> {
    obj.cast_exact::<T>().map_err(|_| match obj.repr() {
        Ok(r) => PyValueError::new_err(format!("Expected {what}, got {r}.")),
        Err(e) => e,
    })
}

fn check_arity(what: &str, expected: usize, got: usize, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    if expected != got {
        return Err(PyValueError::new_err(format!(
            "{what} arity mismatch: {got} != {expected}; {}: {}.",
            what.to_lowercase(),
            obj.repr()?
        )));
    }
    Ok(())
}
