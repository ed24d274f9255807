//! `StaticArguments`: how a `treeclone.jit` call's static arguments are taken out and keyed,
//! by the native call (`LeanCall`), and put back by a stage's (`StageCall`, from the key).

use super::replace_last;
use crate::keys::order::str_order;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PyTuple, PyType};
use pyo3::PyTraverseError;
use std::sync::Mutex;

/// `static_argnums` (negative ones count from the end) and `static_argnames`, and
/// `hash_static(value)`, which raises jax.jit's error for a value that cannot be hashed.
#[pyclass(frozen, module = "treeclone._native")]
pub struct StaticArguments {
    nums: Py<PyFrozenSet>,
    names: Py<PyFrozenSet>,
    hash_static: Py<PyAny>,
    /// The last call's split: a loop passes the same static values call after call, and
    /// then the last key serves again (JAX still hashes the values in it at every call).
    last: Mutex<Option<LastSplit>>,
}

/// A call's arguments with the static ones taken out.
pub(crate) struct Split<'py> {
    pub(crate) args: Bound<'py, PyTuple>,
    /// `(number of positional arguments, ((position, type, value), ...), ((name, type,
    /// value), ...))`: jax.jit keys a static value with its type (2 and 2.0 trace apart).
    pub(crate) key: Bound<'py, PyTuple>,
    pub(crate) values: Vec<Bound<'py, PyAny>>,
    /// The position of each dynamic positional argument among all of them.
    pub(crate) positions: Bound<'py, PyTuple>,
}

/// `(keyword or None, value, type)` of a static value kept by `LastSplit`.
type StaticValue = (Option<Py<PyAny>>, Py<PyAny>, Py<PyType>);

/// Where a static value was given: its position, or its keyword.
enum Place<'py> {
    At(usize),
    Named(Bound<'py, PyAny>),
}

/// What a split leaves for the next call: its key serves a call with as many positional
/// arguments whose static values are the same objects, of the same types, in the same places.
struct LastSplit {
    /// The number of positional arguments, and whether each is static.
    static_at: Vec<bool>,
    /// Each static value with its type and its keyword (None for a positional one):
    /// positional ones first, then keywords by name, as in the key.
    values: Vec<StaticValue>,
    key: Py<PyTuple>,
    positions: Py<PyTuple>,
}

#[pymethods]
impl StaticArguments {
    #[new]
    fn new(nums: Py<PyFrozenSet>, names: Py<PyFrozenSet>, hash_static: Py<PyAny>) -> Self {
        StaticArguments {
            nums,
            names,
            hash_static,
            last: Mutex::new(None),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.nums)?;
        visit.call(&self.names)?;
        visit.call(&self.hash_static)?;
        if let Ok(last) = self.last.try_lock() {
            if let Some(last) = last.as_ref() {
                for (name, value, ty) in &last.values {
                    if let Some(name) = name {
                        visit.call(name)?;
                    }
                    visit.call(value)?;
                    visit.call(ty)?;
                }
                visit.call(&last.key)?;
                visit.call(&last.positions)?;
            }
        }
        Ok(())
    }
}

/// A dict's items, copied out first: a keyword's `__eq__` (a `str` subclass's) runs Python.
pub(crate) fn keyword_items<'py>(
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    kwargs
        .items()
        .iter()
        .map(|item| item.extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>())
        .collect()
}

impl StaticArguments {
    /// Take the static arguments out of a call (see `Split`); the static keywords leave
    /// `items` (the call's keyword items), the dynamic ones stay.
    pub(crate) fn split<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        items: &mut Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    ) -> PyResult<Split<'py>> {
        let static_at = self.static_at(py, args.len())?;
        let mut dynamic = Vec::with_capacity(args.len());
        let mut values = Vec::new();
        for (i, (arg, &is_static)) in args.iter().zip(&static_at).enumerate() {
            if is_static {
                values.push((Place::At(i), arg));
            } else {
                dynamic.push(arg);
            }
        }
        let names = self.names.bind(py);
        let mut named = Vec::new();
        let mut kept = Vec::with_capacity(items.len());
        for (name, value) in items.drain(..) {
            if names.contains(&name)? {
                named.push((name, value));
            } else {
                kept.push((name, value));
            }
        }
        *items = kept;
        if named.len() > 1 {
            named = sorted_by_name(py, named)?;
        }
        values.extend(
            named
                .into_iter()
                .map(|(name, value)| (Place::Named(name), value)),
        );
        let args = PyTuple::new(py, dynamic)?;
        let (key, positions) = match self.last_key(py, &static_at, &values) {
            Some(found) => found,
            None => self.new_key(py, static_at, &values)?,
        };
        Ok(Split {
            args,
            key,
            values: values.into_iter().map(|(_, value)| value).collect(),
            positions,
        })
    }

    /// jax.jit's error for a static value of a split that cannot be hashed.
    pub(crate) fn check_hashable(&self, py: Python<'_>, split: &Split<'_>) -> PyResult<()> {
        let hash_static = self.hash_static.bind(py);
        for value in &split.values {
            if value.hash().is_err() {
                hash_static.call1((value,))?;
            }
        }
        Ok(())
    }

    /// Whether each of `n` positional arguments is static: the last split's answer when it
    /// had as many.
    fn static_at(&self, py: Python<'_>, n: usize) -> PyResult<Vec<bool>> {
        if let Ok(last) = self.last.lock() {
            if let Some(last) = last.as_ref().filter(|last| last.static_at.len() == n) {
                return Ok(last.static_at.clone());
            }
        }
        let nums = self.nums.bind(py);
        let n = n as isize;
        (0..n)
            .map(|i| Ok(nums.contains(i)? || nums.contains(i - n)?))
            .collect()
    }

    /// The last split's key and positions, when this call's static values are its values
    /// (identity only: no Python code runs while the lock is held).
    fn last_key<'py>(
        &self,
        py: Python<'py>,
        static_at: &[bool],
        values: &[(Place<'py>, Bound<'py, PyAny>)],
    ) -> Option<(Bound<'py, PyTuple>, Bound<'py, PyTuple>)> {
        let last = self.last.lock().ok()?;
        let last = last.as_ref()?;
        let same = last.static_at == static_at
            && last.values.len() == values.len()
            && last
                .values
                .iter()
                .zip(values)
                .all(|((n0, v0, t0), (n1, v1))| {
                    v0.is(v1)
                        && t0.is(v1.get_type())
                        && match (n0, n1) {
                            (None, Place::At(_)) => true, // the same places: `static_at`
                            (Some(a), Place::Named(b)) => a.is(b),
                            _ => false,
                        }
                });
        same.then(|| (last.key.bind(py).clone(), last.positions.bind(py).clone()))
    }

    /// The key and positions of a split (see `Split`), kept for the next call.
    fn new_key<'py>(
        &self,
        py: Python<'py>,
        static_at: Vec<bool>,
        values: &[(Place<'py>, Bound<'py, PyAny>)],
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyTuple>)> {
        let (mut fixed, mut named) = (Vec::new(), Vec::new());
        let mut kept = Vec::with_capacity(values.len());
        for (name, value) in values {
            let ty = value.get_type();
            let (place, name) = match name {
                Place::At(i) => (i.into_pyobject(py)?.into_any(), None),
                Place::Named(name) => (name.clone(), Some(name.clone().unbind())),
            };
            let entry = PyTuple::new(py, [place, ty.clone().into_any(), value.clone()])?;
            if name.is_some() {
                named.push(entry);
            } else {
                fixed.push(entry);
            }
            kept.push((name, value.clone().unbind(), ty.unbind()));
        }
        let n = static_at.len();
        let key = PyTuple::new(
            py,
            [
                n.into_pyobject(py)?.into_any(),
                PyTuple::new(py, fixed)?.into_any(),
                PyTuple::new(py, named)?.into_any(),
            ],
        )?;
        let dynamic: Vec<usize> = (0..n).filter(|&i| !static_at[i]).collect();
        let positions = PyTuple::new(py, dynamic)?;
        let made = LastSplit {
            static_at,
            values: kept,
            key: key.clone().unbind(),
            positions: positions.clone().unbind(),
        };
        replace_last(&self.last, made);
        Ok((key, positions))
    }
}

/// Keyword items sorted by name (the names differ): natively for exact `str` names
/// (`keys::order::str_order`), else with Python's sort.
fn sorted_by_name<'py>(
    py: Python<'py>,
    mut items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    if let Some(order) = str_order(items.iter().map(|(name, _)| name)) {
        let mut slots: Vec<_> = items.into_iter().map(Some).collect();
        return Ok(order
            .iter()
            .filter_map(|&i| slots[i as usize].take())
            .collect());
    }
    let pairs = PyList::new(
        py,
        items
            .drain(..)
            .map(|(k, v)| PyTuple::new(py, [k, v]))
            .collect::<PyResult<Vec<_>>>()?,
    )?;
    pairs.sort()?;
    pairs
        .iter()
        .map(|pair| Ok((pair.get_item(0)?, pair.get_item(1)?)))
        .collect()
}

/// The call's own keyword dict, in sorted order: keyword order is not part of a call's
/// structure, as in jax.jit (keyword names are strings).
pub(crate) fn sorted_dict<'py>(
    py: Python<'py>,
    items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyDict>> {
    let items = if items.len() > 1 {
        sorted_by_name(py, items)?
    } else {
        items
    };
    let dict = PyDict::new(py);
    for (k, v) in items {
        dict.set_item(k, v)?;
    }
    Ok(dict)
}
