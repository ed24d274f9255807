//! What a native flatten of a flax nnx node made of its dict (a Variable's metadata, a Module's
//! `vars`), kept while the dict holds the very same keys and values.
//!
//! A training loop flattens the same Modules and Variables at every step: their attribute and
//! metadata dicts keep the same objects (a step replaces the arrays inside the Variables, not
//! the Variables in the Modules), yet each flatten sorted the dict and built new aux tuples,
//! and every later comparison of the structure compared those tuples item by item. A `Memo`
//! keeps the aux (and, for a Module, which attributes are children) under the dict's address,
//! with strong references to everything the result depends on: the dict's keys, the values
//! the aux holds (a Variable's metadata, a Module's static attributes; not its children, which
//! are read from the dict at every flatten), and any other dict it was read with (a Module's
//! `_pytree__nodes` mapping, of names and bools). None of their addresses can be reused while
//! the memo lives, so a dict found holding the same objects in the same order (checked at
//! every use, whichever dict now has the address) gets exactly what the flatten would make
//! again. It keeps neither the dict nor a Module's children alive (their arrays). The memo is
//! per thread (no lock on the hot path) and is emptied when full.
//!
//! A Variable's metadata is memoized by its content instead (`lookup_items`, `store_items`):
//! a functional loop (`nnx.split` state in, new state out) gets new Variables at every step,
//! each with a new metadata dict (`dict(aux)`) holding the very same keys and values. Kept
//! under the dict's address, each step's flatten missed, built new aux tuples and kept them
//! until the memo filled (122 new memos a step on flax's 20-block model, and the tuples'
//! allocations set off a garbage collection at almost every step); kept under the identity
//! of the items, the new dicts find the memo their values came from.

use crate::cpython::internals;
use crate::keys::address::{insert_bounded, AddressMap};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::RefCell;
use std::rc::Rc;

/// A dict's items, in insertion order: each key, and its value where a result depends on it.
type Items = Vec<(Py<PyAny>, Option<Py<PyAny>>)>;

/// One dict's memo.
pub struct Memo {
    /// The dict's items, in insertion order, when the result was made: each key, and its value
    /// where the result depends on it.
    items: Items,
    /// Another dict the result was read from (a Module's `_pytree__nodes` mapping), with its
    /// items then and its PEP 509 version (0: none to go by).
    other: Option<(Py<PyDict>, Items, u64)>,
    /// For a Module: the insertion index of each child, in the flatten's order.
    pub children: Vec<u32>,
    pub aux: Py<PyAny>,
}

const MEMO_MAX: usize = 8192;

thread_local! {
    static MEMOS: RefCell<AddressMap<usize, Rc<Memo>>> = RefCell::new(AddressMap::default());
    /// Memos of dicts by their items' identities (`items_hash`); every value kept.
    static BY_ITEMS: RefCell<AddressMap<u64, Rc<Memo>>> = RefCell::new(AddressMap::default());
}

/// A hash of a dict's items by identity, in order (from `(key, value)` pointers).
fn items_hash(items: impl Iterator<Item = (usize, usize)>) -> u64 {
    let mut hash = 0u64;
    for (key, value) in items {
        for pointer in [key, value] {
            hash = (hash.rotate_left(5) ^ pointer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    hash
}

/// Whether `dict` holds `items` (the same keys in the same order, each kept value the same
/// object), giving `each` its values, in order.
fn matches<'py>(
    dict: &Bound<'py, PyDict>,
    items: &Items,
    mut each: impl FnMut(Bound<'py, PyAny>),
) -> bool {
    if dict.len() != items.len() {
        return false;
    }
    for ((k, v), (k0, v0)) in dict.iter().zip(items) {
        if !k.is(k0) || v0.as_ref().is_some_and(|v0| !v.is(v0)) {
            return false;
        }
        each(v);
    }
    true
}

/// `matches`, with the dict's values.
fn holds<'py>(dict: &Bound<'py, PyDict>, items: &Items) -> Option<Vec<Bound<'py, PyAny>>> {
    let mut values = Vec::with_capacity(items.len());
    matches(dict, items, |v| values.push(v)).then_some(values)
}

/// The memo of `dict` (read with `other`), if it still holds: with the dict's values in
/// insertion order.
pub fn lookup<'py>(
    dict: &Bound<'py, PyDict>,
    other: Option<&Bound<'py, PyDict>>,
) -> Option<(Rc<Memo>, Vec<Bound<'py, PyAny>>)> {
    let address = dict.as_ptr() as usize;
    let memo = MEMOS.with(|cell| cell.try_borrow().ok()?.get(&address).cloned())?;
    let values = holds(dict, &memo.items)?;
    match (&memo.other, other) {
        (None, None) => {}
        (Some((kept, items, version)), Some(other))
            if kept.is(other) && (unchanged(other, *version) || matches(other, items, drop)) => {}
        _ => return None,
    }
    Some((memo, values))
}

/// Whether `dict` has not changed since it had `version` (PEP 509: every change of a dict's
/// items gives it a new version, never given before): a flax class's `_pytree__nodes`,
/// shared by its Modules, is then not compared item by item at each of them.
fn unchanged(dict: &Bound<'_, PyDict>, version: u64) -> bool {
    version != 0 && internals().is_some_and(|gate| gate.dict_version(dict) == version)
}

/// The memo of any dict holding the same keys and values (the same objects, in the same
/// order) as the one it was stored for with `store_items`.
pub fn lookup_items(dict: &Bound<'_, PyDict>) -> Option<Rc<Memo>> {
    let hash = items_hash(
        dict.iter()
            .map(|(k, v)| (k.as_ptr() as usize, v.as_ptr() as usize)),
    );
    let memo = BY_ITEMS.with(|cell| cell.try_borrow().ok()?.get(&hash).cloned())?;
    matches(dict, &memo.items, drop).then_some(memo)
}

/// Keep `aux`, what a flatten made of `dict` (whose items it read as `read`) and of nothing
/// else, for every dict with the same items (`lookup_items`). Nothing is kept when the dict
/// changed since it was read.
pub fn store_items<'py>(dict: &Bound<'py, PyDict>, read: &Read<'py>, aux: &Bound<'py, PyAny>) {
    // From here to the insert, no Python code runs (increfs and Rust allocations only).
    if !still_holds(dict, read) {
        return;
    }
    let hash = items_hash(
        read.iter()
            .map(|(k, v)| (k.as_ptr() as usize, v.as_ptr() as usize)),
    );
    let memo = Rc::new(Memo {
        items: kept_items(read, |_| true),
        other: None,
        children: Vec::new(),
        aux: aux.clone().unbind(),
    });
    BY_ITEMS.with(|memos| insert_bounded(memos, hash, memo, MEMO_MAX));
}

/// A dict's items as a flatten read them, before anything it did could run Python code (which
/// may change the dict: `store` keeps a result only if the dict still holds them).
pub type Read<'py> = Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>;

/// `dict`'s items now (increfs only).
pub fn read<'py>(dict: &Bound<'py, PyDict>) -> Read<'py> {
    dict.iter().collect()
}

/// Whether `dict` holds exactly the items `read` (the same objects, in the same order).
fn still_holds(dict: &Bound<'_, PyDict>, read: &Read<'_>) -> bool {
    dict.len() == read.len()
        && dict
            .iter()
            .zip(read)
            .all(|((k, v), (k0, v0))| k.is(k0) && v.is(v0))
}

/// Keep what a flatten made of `dict` (whose items it read as `read`; with `other`, another
/// dict and its items as read): `children` (insertion indices) and `aux`, which depend on the
/// dict's keys and on its values at no index in `children` (see `Memo`). Nothing is kept when
/// either dict changed since it was read.
pub fn store<'py>(
    dict: &Bound<'py, PyDict>,
    read: &Read<'py>,
    other: Option<(&Bound<'py, PyDict>, &Read<'py>)>,
    children: Vec<u32>,
    aux: &Bound<'py, PyAny>,
) {
    let mut is_child = vec![false; read.len()];
    for &i in &children {
        if let Some(flag) = is_child.get_mut(i as usize) {
            *flag = true;
        }
    }
    // From here to the insert, no Python code runs (increfs and Rust allocations only).
    if !still_holds(dict, read) || other.is_some_and(|(o, r)| !still_holds(o, r)) {
        return;
    }
    let version = |o: &Bound<'py, PyDict>| internals().map_or(0, |gate| gate.dict_version(o));
    let memo = Rc::new(Memo {
        items: kept_items(read, |i| !is_child[i]),
        other: other.map(|(o, r)| (o.clone().unbind(), kept_items(r, |_| true), version(o))),
        children,
        aux: aux.clone().unbind(),
    });
    MEMOS.with(|memos| insert_bounded(memos, dict.as_ptr() as usize, memo, MEMO_MAX));
}

/// The items `read` as a memo keeps them: each key, and its value where `keep_value` says so
/// (by insertion index).
fn kept_items(read: &Read<'_>, keep_value: impl Fn(usize) -> bool) -> Items {
    (0..)
        .zip(read)
        .map(|(i, (k, v))| {
            (
                k.clone().unbind(),
                keep_value(i).then(|| v.clone().unbind()),
            )
        })
        .collect()
}

/// Forget this thread's memos (with the key orders: `clear_key_order_cache`).
pub fn clear() {
    let old = MEMOS.with(|cell| cell.try_borrow_mut().map(|mut m| std::mem::take(&mut *m)));
    let by_items = BY_ITEMS.with(|cell| cell.try_borrow_mut().map(|mut m| std::mem::take(&mut *m)));
    drop((old, by_items));
}
