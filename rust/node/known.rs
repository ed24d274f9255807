//! Flatten functions of well-known node types, run natively: flax nnx's
//! `Pytree._pytree__flatten` (every nnx Module, `nnx.Optimizer`, ...), `_variable_flatten`
//! (every `nnx.Variable`), `_flatten_pytree_state` (the `PytreeState` each Module holds) and
//! `_state_flatten` (every `nnx.State`, the functional form's nested mappings). An
//! nnx model is mostly such nodes, and their Python flatten functions (a sort of `vars(self)`,
//! three tuples per Module; a sorted metadata tuple per Variable) were most of the cost of
//! flattening one. And the flatten `jax.tree_util.register_dataclass` makes (its fields read
//! one by one: 1.5 us a node in Python, where jaxlib reads them in C++).
//!
//! Each is reproduced exactly: the same children and an aux equal to the function's, made of the
//! same objects (ints, an nnx.List's keys, equal ones). A node outside the case reproduced (a
//! name `int` might read other than as written, a `__dict__` that is not a dict, a key that is
//! not a str, an attribute that raises) runs the Python function instead, which
//! then gives its own result or error. The first node of each type is flattened both ways and
//! compared: a flax release whose function returns something else turns the native path off for
//! that type, so a change in flax costs speed, never correctness.

use super::memo;
use crate::cpython::SlotReader;
use crate::keys::address::AddressMap;
use crate::keys::order;
use crate::registry::{Check, CustomType, Known};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyInt, PyString, PyTuple, PyType};

type Flat<'py> = (Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>);

/// `obj`'s children and aux data from the native version of its type's flatten function, or
/// None where the Python function must run (no native version, or a case it does not cover).
/// `python` is that function, run on the first node of each type to check the native one.
pub fn flatten<'py>(
    obj: &Bound<'py, PyAny>,
    custom: &CustomType,
    python: impl FnOnce() -> PyResult<Flat<'py>>,
) -> PyResult<Option<Flat<'py>>> {
    let Some(known) = &custom.known else {
        return Ok(None);
    };
    let state = known.check();
    if state == Check::Differs {
        return Ok(None);
    }
    let native = match &known.known {
        Known::Pytree => nnx_pytree(obj),
        Known::Variable { value, metadata } => nnx_variable(obj, value, metadata),
        Known::PytreeState {
            initializing,
            is_setup,
        } => nnx_pytree_state(obj, initializing, is_setup),
        Known::State => nnx_state(obj),
        Known::Dataclass { data, meta } => dataclass(obj, data, meta),
    };
    let Some(native) = native else {
        return Ok(None);
    };
    if state == Check::Agrees {
        return Ok(Some(native));
    }
    let expected = python()?;
    let agrees = native.0.len() == expected.0.len()
        && native.0.iter().zip(&expected.0).all(|(a, b)| a.is(b))
        && same_objects(&native.1, &expected.1);
    known.set_check(agrees);
    // Where they agree, the native result, as every later node of the type gets (its aux the
    // one memoized: the first node's flatten then equals the later ones' by identity too).
    Ok(Some(if agrees { native } else { expected }))
}

/// Put `obj`'s children, as its type's flatten function gives them but in no particular
/// order, into `out` (emptied first), for a walk that needs nothing else (the cycle check):
/// the native version's, without the sorting and the aux data it never reads. None where it
/// does not apply (no native version, or one not yet checked against the function, or a case
/// it does not cover; `out` is then empty), and the caller runs the whole flatten. `out` is
/// the caller's to reuse: a Variable's one child costs no allocation.
pub fn children_into<'py>(
    obj: &Bound<'py, PyAny>,
    custom: &CustomType,
    out: &mut Vec<Bound<'py, PyAny>>,
) -> Option<()> {
    out.clear();
    let found = children(obj, custom, out);
    if found.is_none() {
        out.clear();
    }
    found
}

fn children<'py>(
    obj: &Bound<'py, PyAny>,
    custom: &CustomType,
    out: &mut Vec<Bound<'py, PyAny>>,
) -> Option<()> {
    let known = custom.known.as_ref()?;
    if known.check() != Check::Agrees {
        return None;
    }
    let py = obj.py();
    match &known.known {
        Known::Variable { value, .. } => {
            out.push(value.getattr(obj, intern!(py, "_raw_value")).ok()?)
        }
        Known::PytreeState { .. } => {}
        Known::State => {
            let mapping = dict_attr(obj, intern!(py, "_mapping"))?;
            out.extend(mapping.values().iter());
        }
        Known::Pytree => nnx_pytree_children(obj, out)?,
        Known::Dataclass { .. } => return None,
    }
    Some(())
}

/// `nnx_pytree`'s children, unsorted: the attributes of `vars(obj)` marked as data.
fn nnx_pytree_children<'py>(
    obj: &Bound<'py, PyAny>,
    out: &mut Vec<Bound<'py, PyAny>>,
) -> Option<()> {
    let (vars, nodes, _) = pytree_dicts(obj)?;
    // Copied out first (increfs only): the lookups below may run a key's `__eq__`.
    let items: Vec<_> = vars.iter().collect();
    for (key, value) in items {
        key.cast_exact::<PyString>().ok()?;
        let is_data = match nodes.get_item(&key).ok()? {
            Some(flag) => flag.is_truthy().ok()?,
            None => false,
        };
        if is_data {
            out.push(value);
        }
    }
    Some(())
}

/// The same object, or tuples of the same length whose items are (recursively) the same.
fn same_objects(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> bool {
    if a.is(b) {
        return true;
    }
    match (a.cast_exact::<PyTuple>(), b.cast_exact::<PyTuple>()) {
        (Ok(x), Ok(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| same_objects(&p, &q))
        }
        // An nnx.List's keys: `int(name)` makes a new int object past the small ints.
        _ if a.is_exact_instance_of::<PyInt>() && b.is_exact_instance_of::<PyInt>() => {
            a.eq(b).unwrap_or(false)
        }
        _ => false,
    }
}

/// A dict's items with str keys, sorted by key (Python's order for str: by code point, which
/// is UTF-8's byte order); None if a key is not an exact str or is not valid UTF-8 (a lone
/// surrogate). The order comes from the traversal's cache of key orders (a Module's
/// attributes and a Variable's metadata have the same keys call after call).
fn sorted_str_items<'py>(
    dict: &Bound<'py, PyDict>,
) -> Option<Vec<(Bound<'py, PyString>, Bound<'py, PyAny>)>> {
    let py = dict.py();
    let mut values = Vec::with_capacity(dict.len());
    let keys = order::sorted_str_children(py, dict, &mut values)?;
    let keys = keys.into_bound(py);
    let mut items = Vec::with_capacity(values.len());
    for (key, value) in keys.iter().zip(values) {
        items.push((
            key.cast_into_exact::<PyString>().ok()?,
            value.into_bound(py),
        ));
    }
    Some(items)
}

/// `obj.<name>` when it is an exact dict.
fn dict_attr<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> Option<Bound<'py, PyDict>> {
    obj.getattr(name).ok()?.cast_into_exact::<PyDict>().ok()
}

/// flax's `HashableMapping` (the type of a Pytree's `_pytree__nodes`).
fn hashable_mapping(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        Ok(py
            .import("flax.typing")?
            .getattr("HashableMapping")?
            .cast_into::<PyType>()?
            .unbind())
    })
    .ok()
    .map(|t| t.bind(py))
}

/// A flax `Pytree`'s `vars(obj)`, the `_mapping` of its `_pytree__nodes` (which attributes
/// are data) and its `_pytree__has_int_keys` (an `nnx.List`: names that are numbers are keyed
/// by the number); None where a read fails or is not of the type flax makes.
fn pytree_dicts<'py>(
    obj: &Bound<'py, PyAny>,
) -> Option<(Bound<'py, PyDict>, Bound<'py, PyDict>, bool)> {
    let py = obj.py();
    let vars = dict_attr(obj, intern!(py, "__dict__"))?;
    let int_keys = (obj.getattr(intern!(py, "_pytree__has_int_keys")).ok()?)
        .cast_into_exact::<PyBool>()
        .ok()?
        .is_true();
    let nodes = obj.getattr(intern!(py, "_pytree__nodes")).ok()?;
    if !nodes.get_type().is(hashable_mapping(py)?) {
        return None;
    }
    let nodes = dict_attr(&nodes, intern!(py, "_mapping"))?;
    Some((vars, nodes, int_keys))
}

/// An attribute of a flax `Pytree` as its flatten sorts it: its key (the name, or for an
/// `nnx.List` a name that is a number, the number), its name, its value.
type Attribute<'py> = (Bound<'py, PyAny>, Bound<'py, PyString>, Bound<'py, PyAny>);

/// `vars(obj)`'s items sorted as `_pytree__flatten` sorts them: by name; with int keys, flax's
/// `_maybe_int` of each name first (`int(name)`, or the name where that fails) and ints before
/// names, each in order. Covered: names that are exact, valid-UTF-8 strs, and with int keys
/// each either plain decimal digits (no sign, no leading zero, fits an i64: `int` reads it as
/// written) or starting with an ASCII letter or `_` (`int` refuses it); None otherwise.
fn sorted_attributes<'py>(
    vars: &Bound<'py, PyDict>,
    int_keys: bool,
) -> Option<Vec<Attribute<'py>>> {
    if !int_keys {
        let items = sorted_str_items(vars)?;
        return Some(
            items
                .into_iter()
                .map(|(k, v)| (k.clone().into_any(), k, v))
                .collect(),
        );
    }
    let py = vars.py();
    let (mut numbers, mut names) = (Vec::new(), Vec::new());
    for (name, value) in vars.iter() {
        let name = name.cast_into_exact::<PyString>().ok()?;
        let text = name.to_str().ok()?;
        let digits = text.bytes().all(|b| b.is_ascii_digit());
        match text.as_bytes().first()? {
            b'0'..=b'9' if digits && (text == "0" || !text.starts_with('0')) => {
                numbers.push((text.parse::<i64>().ok()?, name, value));
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => names.push((text.to_owned(), name, value)),
            _ => return None,
        }
    }
    numbers.sort_unstable_by_key(|(number, _, _)| *number);
    names.sort_unstable_by(|a, b| a.0.cmp(&b.0)); // code point order: UTF-8's byte order
    let numbered =
        (numbers.into_iter()).map(|(n, name, v)| (PyInt::new(py, n).into_any(), name, v));
    Some(
        numbered
            .chain(
                names
                    .into_iter()
                    .map(|(_, name, v)| (name.clone().into_any(), name, v)),
            )
            .collect(),
    )
}

/// `Pytree._pytree__flatten`: the attributes of `vars(self)` sorted by name, those marked as
/// data in `_pytree__nodes` the children, and aux `(data names, static names, static values)`.
fn nnx_pytree<'py>(obj: &Bound<'py, PyAny>) -> Option<Flat<'py>> {
    let py = obj.py();
    let (vars, nodes, int_keys) = pytree_dicts(obj)?;
    if let Some((memo, values)) = memo::lookup(&vars, Some(&nodes)) {
        let children = memo.children.iter().map(|&i| values[i as usize].clone());
        return Some((children.collect(), memo.aux.bind(py).clone()));
    }
    let (vars_read, nodes_read) = (memo::read(&vars), memo::read(&nodes));
    // The insertion index of each attribute, to memoize which are children.
    let index: AddressMap<usize, u32> = (0..)
        .zip(&vars_read)
        .map(|(i, (key, _))| (key.as_ptr() as usize, i))
        .collect();
    let items = sorted_attributes(&vars, int_keys)?;
    let (mut children, mut node_keys, mut positions) = (Vec::new(), Vec::new(), Vec::new());
    let (mut static_keys, mut static_values) = (Vec::new(), Vec::new());
    // Flags that are not bools (whose truth could change) are not memoized.
    let mut memoizable = true;
    for (key, name, value) in items {
        let is_data = match nodes.get_item(&name).ok()? {
            Some(flag) => {
                memoizable &= flag.is_instance_of::<PyBool>();
                flag.is_truthy().ok()?
            }
            None => false,
        };
        if is_data {
            positions.push(*index.get(&(name.as_ptr() as usize))?);
            node_keys.push(key);
            children.push(value);
        } else {
            static_keys.push(key);
            static_values.push(value);
        }
    }
    let aux = PyTuple::new(
        py,
        [
            PyTuple::new(py, node_keys).ok()?,
            PyTuple::new(py, static_keys).ok()?,
            PyTuple::new(py, static_values).ok()?,
        ],
    )
    .ok()?
    .into_any();
    if memoizable {
        let nodes = (&nodes, &nodes_read);
        memo::store(&vars, &vars_read, Some(nodes), positions, &aux);
    }
    Some((children, aux))
}

/// `_variable_flatten`: child `x._raw_value`, aux the sorted items of `x._var_metadata`.
fn nnx_variable<'py>(
    obj: &Bound<'py, PyAny>,
    value: &SlotReader,
    metadata: &SlotReader,
) -> Option<Flat<'py>> {
    let py = obj.py();
    let metadata = metadata
        .getattr(obj, intern!(py, "_var_metadata"))
        .ok()?
        .cast_into_exact::<PyDict>()
        .ok()?;
    let value = value.getattr(obj, intern!(py, "_raw_value")).ok()?;
    if let Some(memo) = memo::lookup_items(&metadata) {
        return Some((vec![value], memo.aux.bind(py).clone()));
    }
    let read = memo::read(&metadata);
    let items = sorted_str_items(&metadata)?;
    let mut pairs = Vec::with_capacity(items.len());
    for (key, item) in items {
        pairs.push(PyTuple::new(py, [key.into_any(), item]).ok()?);
    }
    let aux = PyTuple::new(py, pairs).ok()?.into_any();
    memo::store_items(&metadata, &read, &aux);
    Some((vec![value], aux))
}

/// `_flatten_pytree_state`: no children, aux `(state.initializing, state.is_setup)`, read
/// from the slots those two properties return (`_initializing`, `_is_setup`): a property is
/// a Python call, two for every Module of a model.
fn nnx_pytree_state<'py>(
    obj: &Bound<'py, PyAny>,
    initializing: &SlotReader,
    is_setup: &SlotReader,
) -> Option<Flat<'py>> {
    let py = obj.py();
    let initializing = initializing
        .getattr(obj, intern!(py, "_initializing"))
        .ok()?;
    let is_setup = is_setup.getattr(obj, intern!(py, "_is_setup")).ok()?;
    let aux = PyTuple::new(py, [initializing, is_setup]).ok()?;
    Some((Vec::new(), aux.into_any()))
}

/// `_state_flatten`: the items of `state._mapping` sorted (by key: keys are distinct), the
/// values the children, aux the keys. Covered: keys all str, or all int (nnx.List's layers).
fn nnx_state<'py>(obj: &Bound<'py, PyAny>) -> Option<Flat<'py>> {
    let py = obj.py();
    let mapping = dict_attr(obj, intern!(py, "_mapping"))?;
    let items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = match sorted_str_items(&mapping) {
        Some(items) => items.into_iter().map(|(k, v)| (k.into_any(), v)).collect(),
        None => sorted_int_items(&mapping)?,
    };
    let (keys, children): (Vec<_>, Vec<_>) = items.into_iter().unzip();
    Some((children, PyTuple::new(py, keys).ok()?.into_any()))
}

/// A dict's items with exact int keys that fit an i64, sorted by key; None otherwise. Only
/// increfs happen while the dict is read.
fn sorted_int_items<'py>(
    dict: &Bound<'py, PyDict>,
) -> Option<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let mut items = Vec::with_capacity(dict.len());
    for (key, value) in dict.iter() {
        let number = key.cast_exact::<PyInt>().ok()?.extract::<i64>().ok()?;
        items.push((number, key, value));
    }
    items.sort_unstable_by_key(|(number, _, _)| *number);
    Some(items.into_iter().map(|(_, k, v)| (k, v)).collect())
}

/// `register_dataclass`'s `flatten_func`: children the `data` fields' values, aux the tuple of
/// the `meta` fields' values, read first (each field by `getattr`).
fn dataclass<'py>(
    obj: &Bound<'py, PyAny>,
    data: &[Py<PyString>],
    meta: &[Py<PyString>],
) -> Option<Flat<'py>> {
    let py = obj.py();
    let read = |names: &[Py<PyString>]| -> Option<Vec<Bound<'py, PyAny>>> {
        names
            .iter()
            .map(|name| obj.getattr(name.bind(py)).ok())
            .collect()
    };
    let aux = PyTuple::new(py, read(meta)?).ok()?;
    Some((read(data)?, aux.into_any()))
}
