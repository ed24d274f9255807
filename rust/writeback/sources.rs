//! Where the results of a call come from: each leaf's `Source`, each node's `Origin` in the
//! caller's tree (given by Python at trace time), and the computation's `Outputs`.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

/// Where a result leaf comes from.
#[pyclass(frozen, skip_from_py_object, module = "treeclone._native")]
#[derive(Clone, Copy)]
pub enum Source {
    /// The caller's input leaf in this slot (unchanged by the function: not materialized).
    Input { slot: usize },
    /// The computation's output at this index.
    Output { index: usize },
}

/// How a node of the results relates to the caller's tree (for write-back).
#[pyclass(frozen, get_all, module = "treeclone._native")]
pub struct Origin {
    /// Node index in the caller's tree.
    pub(super) node: usize,
    /// Node indices of its children in the caller's tree.
    pub(super) old_children: Vec<usize>,
    /// Whether its node data (dict keys, custom aux) is unchanged.
    pub(super) same_data: bool,
    /// Whether it can be updated in place (list, dict, writable custom object).
    pub(super) writable: bool,
    /// A dict's keys in the order the function left them (insertion order of new keys).
    pub(super) key_order: Option<Py<PyTuple>>,
    /// Whether the function reordered the dict keys it kept (else they keep the caller's
    /// order, which the function may not have seen: a flatten may sort them).
    pub(super) reordered: bool,
    /// A custom node's attributes the function changed (None: let `write_custom` decide).
    pub(super) attrs: Option<Py<PyTuple>>,
    /// When every changed attribute of a custom node holds one of its children as it is (the
    /// node's unflatten stores child `j` in attribute `name`, as nnx's `Variable` and modules
    /// do): `(name, j)` for each, set directly, without rebuilding the node or calling Python.
    pub(super) direct: Option<Vec<(Py<PyString>, usize)>>,
    /// Whether the node's items can be written entry by entry (rule J20): a list's item `j`
    /// at call start is `old_children[j]`; a dict's value for `old_keys[j]` is
    /// `old_children[j]`. Only the entries the function changed are then written. False: the
    /// whole container is refilled (a subclass whose unflatten converts its items).
    pub(super) by_entry: bool,
    /// A dict's (or dict subclass's) keys at call start, in the order of `old_children`.
    pub(super) old_keys: Option<Py<PyTuple>>,
}

#[pymethods]
impl Origin {
    #[new]
    #[pyo3(signature = (
        *, node, old_children, same_data, writable, key_order=None, reordered=true, attrs=None,
        direct=None, by_entry=false, old_keys=None
    ))]
    #[allow(clippy::too_many_arguments)] // keyword-only, each one a named field
    fn new(
        node: usize,
        old_children: Vec<usize>,
        same_data: bool,
        writable: bool,
        key_order: Option<Py<PyTuple>>,
        reordered: bool,
        attrs: Option<Py<PyTuple>>,
        direct: Option<Vec<(Py<PyString>, usize)>>,
        by_entry: bool,
        old_keys: Option<Py<PyTuple>>,
    ) -> Self {
        Origin {
            node,
            old_children,
            same_data,
            writable,
            key_order,
            reordered,
            attrs,
            direct,
            by_entry,
            old_keys,
        }
    }
}

/// The computation's outputs, as jax hands them over: a list or a tuple.
pub enum Outputs<'py> {
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
}

impl<'py> Outputs<'py> {
    /// `outputs` as a list or a tuple (asked by type: a derived extraction would make and
    /// drop an error at every call that hands over the second kind); None if it is neither.
    pub fn of(outputs: &Bound<'py, PyAny>) -> Option<Self> {
        if let Ok(tuple) = outputs.cast::<PyTuple>() {
            return Some(Outputs::Tuple(tuple.clone()));
        }
        outputs
            .cast::<PyList>()
            .ok()
            .map(|list| Outputs::List(list.clone()))
    }

    pub fn get(&self, i: usize) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Outputs::List(list) => list.get_item(i),
            Outputs::Tuple(tuple) => tuple.get_item(i),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Outputs::List(list) => list.len(),
            Outputs::Tuple(tuple) => tuple.len(),
        }
    }
}
