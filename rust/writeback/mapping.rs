//! Writing a dict (or dict subclass) in place: whole, or only the entries the function
//! changed, with the key order plain Python would leave.

use super::undo::Undo;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyTuple};

/// The value stored for `key` in the dict (or dict subclass) `dict`, read as stored (no
/// `__getitem__`, no `__missing__`), or None.
pub(super) fn raw_get<'py>(
    dict: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    dict.cast::<PyDict>()?.get_item(key)
}

/// Put the dict's keys in `order` (those it still holds; keys it holds that `order` lacks
/// follow, in their order), moving each key with its value as it is now.
pub(super) fn put_in_order<'py>(
    dict: &Bound<'py, PyAny>,
    order: &[Bound<'py, PyAny>],
) -> PyResult<()> {
    let py = dict.py();
    let now = PyList::new(py, dict.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
    let wanted = PyList::empty(py);
    let placed = PySet::empty(py)?;
    for k in order {
        if raw_get(dict, k)?.is_some() && !placed.contains(k)? {
            wanted.append(k)?;
            placed.add(k)?;
        }
    }
    for k in now.iter() {
        if !placed.contains(&k)? {
            wanted.append(&k)?;
        }
    }
    if now.as_any().eq(&wanted)? {
        return Ok(());
    }
    for k in wanted.iter() {
        let v = dict.call_method1("pop", (&k,))?;
        dict.set_item(&k, v)?;
    }
    Ok(())
}

/// Give the dict (or dict subclass) `dict` the items `new` where they differ from what it
/// held at call start (`old_keys[j]` held `old[j]`), by identity (rule J20): keys the function
/// removed are deleted, keys it set to another object or added are set (new keys in
/// `key_order`, after the others), and nothing else is touched. Kept keys keep their place;
/// when the function `reordered` the keys (a dict kind it sees in its own order), they are then
/// moved into `key_order`. Returns how to undo it.
pub(super) fn write_mapping_entries<'py>(
    dict: &Bound<'py, PyAny>,
    new: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    key_order: Option<&Bound<'py, PyTuple>>,
    reordered: bool,
    old_keys: &Bound<'py, PyTuple>,
    old: &[Bound<'py, PyAny>],
) -> PyResult<Undo<'py>> {
    let py = dict.py();
    let before: Vec<Bound<'py, PyAny>> = dict.try_iter()?.collect::<PyResult<_>>()?;
    if old.len() == new.len() && same_keys(&new, key_order, old_keys) {
        // The function kept every key and set values only (a training state's `state["params"]
        // = ...`): entry `j` of `new` is `old_keys[j]`'s, so the two lookup dicts below are not
        // needed; what is written, and in which order, is what they would give.
        let mut ops = Vec::new();
        let mut write = || -> PyResult<()> {
            for ((k, v), o) in new.iter().zip(old) {
                if v.is(o) {
                    continue;
                }
                let value = raw_get(dict, k)?;
                dict.set_item(k, v)?;
                ops.push((k.clone(), value));
            }
            if reordered {
                let order: Vec<Bound<'py, PyAny>> = new.iter().map(|(k, _)| k.clone()).collect();
                put_in_order(dict, &order)?;
            }
            Ok(())
        };
        let written = write();
        return Undo::MappingEntries(dict.clone(), ops, before).kept_or_applied(written);
    }
    let lookup = PyDict::new(py);
    for (k, v) in &new {
        lookup.set_item(k, v)?;
    }
    let was = PyDict::new(py);
    for (k, v) in old_keys.iter().zip(old) {
        was.set_item(k, v)?;
    }
    let order: Vec<Bound<'py, PyAny>> = match key_order {
        Some(order) => order.iter().collect(),
        None => new.iter().map(|(k, _)| k.clone()).collect(),
    };
    let mut ops = Vec::new();
    let mut write = || -> PyResult<()> {
        for k in old_keys.iter() {
            if !lookup.contains(&k)? {
                if let Some(value) = raw_get(dict, &k)? {
                    dict.del_item(&k)?;
                    ops.push((k, Some(value)));
                }
            }
        }
        for k in &order {
            let Some(v) = lookup.get_item(k)? else {
                continue;
            };
            if was.get_item(k)?.is_some_and(|o| o.is(&v)) {
                continue;
            }
            let value = raw_get(dict, k)?;
            dict.set_item(k, v)?;
            ops.push((k.clone(), value));
        }
        if reordered {
            put_in_order(dict, &order)?;
        }
        Ok(())
    };
    let written = write();
    Undo::MappingEntries(dict.clone(), ops, before).kept_or_applied(written)
}

/// Whether `new` has the keys `old_keys`, the very objects in the same order, and `key_order`
/// (when given) lists them in that order too: then `write_mapping_entries` needs no lookup.
fn same_keys(
    new: &[(Bound<'_, PyAny>, Bound<'_, PyAny>)],
    key_order: Option<&Bound<'_, PyTuple>>,
    old_keys: &Bound<'_, PyTuple>,
) -> bool {
    let same = |keys: &Bound<'_, PyTuple>| {
        keys.len() == new.len() && keys.iter_borrowed().zip(new).all(|(key, (k, _))| key.is(k))
    };
    same(old_keys) && key_order.is_none_or(same)
}

/// Make a dict (or dict subclass, through its own methods) hold exactly `items`, in order.
pub(super) fn set_mapping_items<'py>(
    dict: &Bound<'py, PyAny>,
    items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<()> {
    dict.call_method0("clear")?;
    for (k, v) in items {
        dict.set_item(k, v)?;
    }
    Ok(())
}

/// A mapping's items, in order.
pub(super) fn mapping_items<'py>(
    dict: &Bound<'py, PyAny>,
) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    dict.call_method0("items")?
        .try_iter()?
        .map(|item| item?.extract())
        .collect()
}

/// Give the dict (or dict subclass) `dict` the items of `new` in place, as plain Python would
/// leave it: removed keys go and kept keys keep their place, new keys follow in `key_order`
/// (the order the function left, else `new`'s); when the function `reordered` the keys, they
/// end exactly in `key_order` (a key deleted and added back moves to the end). Returns how
/// to undo it.
pub(super) fn write_mapping<'py>(
    dict: &Bound<'py, PyAny>,
    new: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    key_order: Option<&Bound<'py, PyTuple>>,
    reordered: bool,
) -> PyResult<Undo<'py>> {
    let py = dict.py();
    let old = mapping_items(dict)?;
    let lookup = PyDict::new(py);
    for (k, v) in &new {
        lookup.set_item(k, v)?;
    }
    let order: Vec<Bound<'py, PyAny>> = match key_order {
        Some(order) => order.iter().collect(),
        None => new.iter().map(|(k, _)| k.clone()).collect(),
    };
    let write = || -> PyResult<()> {
        for (k, _) in &old {
            if !lookup.contains(k)? {
                dict.del_item(k)?;
            }
        }
        for k in &order {
            if let Some(v) = lookup.get_item(k)? {
                dict.set_item(k, v)?;
            }
        }
        if reordered {
            let now: Vec<Bound<'py, PyAny>> = dict.try_iter()?.collect::<PyResult<_>>()?;
            let same = PyList::new(py, now)?
                .as_any()
                .eq(PyList::new(py, &order)?)?;
            if !same {
                dict.call_method0("clear")?;
                for k in &order {
                    if let Some(v) = lookup.get_item(k)? {
                        dict.set_item(k, v)?;
                    }
                }
            }
        }
        Ok(())
    };
    let written = write();
    Undo::Mapping(dict.clone(), old).kept_or_applied(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(d: &Bound<'_, PyAny>) -> Vec<String> {
        d.try_iter()
            .unwrap()
            .map(|k| k.unwrap().to_string())
            .collect()
    }

    /// `{"b": 0, "a": 1}` written with items of `new` (in that order) and `order`.
    fn written(new: &[&str], order: &[&str], reordered: bool) -> (Vec<String>, Vec<String>) {
        Python::attach(|py| {
            let dict = PyDict::new(py);
            dict.set_item("b", 0).unwrap();
            dict.set_item("a", 1).unwrap();
            let dict = dict.into_any();
            let items = new
                .iter()
                .map(|k| {
                    (
                        k.into_pyobject(py).unwrap().into_any(),
                        9i64.into_pyobject(py).unwrap().into_any(),
                    )
                })
                .collect();
            let order = PyTuple::new(py, order).unwrap();
            let undo = write_mapping(&dict, items, Some(&order), reordered).unwrap();
            let after = keys(&dict);
            undo.apply().unwrap();
            (after, keys(&dict))
        })
    }

    #[test]
    fn kept_keys_keep_their_place_and_new_keys_follow_the_functions_order() {
        // The function saw the keys sorted (a, b), kept that order and added z then y.
        let (after, undone) = written(&["a", "b", "z", "y"], &["a", "b", "z", "y"], false);
        assert_eq!(after, ["b", "a", "z", "y"]);
        assert_eq!(undone, ["b", "a"]);
    }

    #[test]
    fn a_reordering_function_sets_the_exact_order_and_removed_keys_go() {
        let (after, undone) = written(&["x", "a"], &["x", "a"], true);
        assert_eq!(after, ["x", "a"]);
        assert_eq!(undone, ["b", "a"]);
    }
}
