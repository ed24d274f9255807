//! The undo log's steps: how to put back each container or attribute a write-back changed,
//! applied newest first when a later write fails.

use super::attributes::restore_attributes;
use super::list::set_list_items;
use super::mapping::{put_in_order, raw_get, set_mapping_items};
use pyo3::prelude::*;
use pyo3::types::{PyList, PySlice, PyString};

/// How to put a container back as it was.
pub(super) enum Undo<'py> {
    /// A list (or list subclass) and its old items.
    List(Bound<'py, PyAny>, Bound<'py, PyList>),
    /// A dict (or dict subclass) and its old items, in order.
    Mapping(
        Bound<'py, PyAny>,
        Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    ),
    /// A list written entry by entry: the items set, with their old values, and the tail
    /// replaced when it was resized (where it starts, the new tail's length, the old tail).
    ListEntries(
        Bound<'py, PyAny>,
        Vec<(usize, Bound<'py, PyAny>)>,
        Option<(usize, usize, Bound<'py, PyAny>)>,
    ),
    /// A dict written entry by entry: the keys set or deleted, with their old values (None:
    /// absent), and its keys in order before.
    MappingEntries(
        Bound<'py, PyAny>,
        Vec<(Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)>,
        Vec<Bound<'py, PyAny>>,
    ),
    /// What `write_custom` returned.
    Call(Bound<'py, PyAny>),
    /// An object and the attributes set directly, with their old values (None: it had none).
    Attributes(
        Bound<'py, PyAny>,
        Vec<(Bound<'py, PyString>, Option<Bound<'py, PyAny>>)>,
    ),
    /// The same for one attribute (an nnx Variable's value): no allocation at each write.
    Attribute(
        Bound<'py, PyAny>,
        Bound<'py, PyString>,
        Option<Bound<'py, PyAny>>,
    ),
}

impl Undo<'_> {
    /// What an entry-by-entry write returns: this undo when its writes (`written`) went
    /// through, else their error once this has put back the part that was written, so a write
    /// that fails half way leaves its container as it was.
    pub(super) fn kept_or_applied(self, written: PyResult<()>) -> PyResult<Self> {
        match written {
            Ok(()) => Ok(self),
            Err(e) => {
                self.apply()?;
                Err(e)
            }
        }
    }

    /// Put back what the write changed.
    pub(super) fn apply(self) -> PyResult<()> {
        match self {
            Undo::List(l, old) => set_list_items(&l, old.as_any()),
            Undo::Mapping(d, old) => set_mapping_items(&d, old),
            Undo::ListEntries(l, set, tail) => {
                if let Some((start, len, old)) = tail {
                    let slice = PySlice::new(l.py(), start as isize, (start + len) as isize, 1);
                    l.set_item(slice, old)?;
                }
                for (j, v) in set.into_iter().rev() {
                    l.set_item(j, v)?;
                }
                Ok(())
            }
            Undo::MappingEntries(d, ops, order) => {
                for (k, v) in ops.into_iter().rev() {
                    match v {
                        Some(v) => d.set_item(k, v)?,
                        None => {
                            if raw_get(&d, &k)?.is_some() {
                                d.del_item(k)?;
                            }
                        }
                    }
                }
                put_in_order(&d, &order)
            }
            Undo::Call(f) => f.call0().map(|_| ()),
            Undo::Attributes(obj, old) => restore_attributes(&obj, old),
            Undo::Attribute(obj, name, old) => restore_attributes(&obj, vec![(name, old)]),
        }
    }
}
