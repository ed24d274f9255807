//! Dicts: PEP 509 versions, and dicts made with room for their items.

use super::layouts;
use super::{internals, Internals};
use pyo3::prelude::*;
use pyo3::types::PyDict;

impl Internals {
    /// The dict's PEP 509 version (`layouts::dict_version`): a change of its items gives it a
    /// new one, newer than every version given before; 0 (none to go by) on 3.13.
    #[inline]
    pub fn dict_version(self, dict: &Bound<'_, PyDict>) -> u64 {
        // SAFETY: `dict` is a live dict (or subclass: same layout).
        unsafe { layouts::dict_version(self, dict.as_ptr()) }
    }

    /// PEP 509's global clock now (a new dict's version): a dict whose version is above it
    /// was changed after. 0 where dicts have no versions.
    pub fn dict_clock(self, py: Python<'_>) -> u64 {
        self.dict_version(&PyDict::new(py))
    }
}

/// An empty dict with room for `size` items (unflatten fills it next; an empty dict grows to
/// it, resizing on the way, where the internals are off).
pub fn new_dict(py: Python<'_>, size: usize) -> PyResult<Bound<'_, PyDict>> {
    match internals() {
        Some(gate) if size > 5 => {
            // SAFETY: the GIL is held; the result is a new reference to an exact dict, or
            // NULL with an exception set.
            unsafe {
                Bound::from_owned_ptr_or_err(py, layouts::presized_dict(gate, size))
                    .map(|d| d.cast_into_unchecked())
            }
        }
        _ => Ok(PyDict::new(py)),
    }
}

#[cfg(all(test, cpython_layouts))]
mod tests {
    use super::super::tests::gate;
    use super::*;

    #[test]
    fn a_dicts_version_changes_with_its_items_and_only_then() {
        Python::attach(|py| {
            let gate = gate(py);
            let dict = PyDict::new(py);
            let mut seen = vec![(gate.dict_version(&dict), Vec::<(i32, i32)>::new())];
            for step in 0..6 {
                let before = gate.dict_version(&dict);
                let _ = dict.get_item(1).unwrap(); // a read changes nothing
                assert_eq!(gate.dict_version(&dict), before);
                match step {
                    0 => dict.set_item(1, 1).unwrap(),
                    1 => dict.set_item(2, 2).unwrap(),
                    2 => dict.set_item(1, 3).unwrap(),
                    3 => dict.del_item(2).unwrap(),
                    4 => dict.clear(),
                    _ => dict.set_item(4, 4).unwrap(),
                }
                let items: Vec<(i32, i32)> = dict
                    .extract::<std::collections::BTreeMap<_, _>>()
                    .unwrap()
                    .into_iter()
                    .collect();
                seen.push((gate.dict_version(&dict), items));
            }
            if cfg!(Py_3_13) {
                assert!(
                    seen.iter().all(|(v, _)| *v == 0),
                    "3.13: no versions to go by"
                );
                return;
            }
            // Each change gave a newer version than any before it, the clock included.
            for pair in seen.windows(2) {
                assert!(pair[1].0 > pair[0].0);
            }
            assert!(gate.dict_clock(py) > seen.last().unwrap().0);
        });
    }

    #[test]
    fn a_new_dict_is_an_empty_exact_dict_that_takes_its_items() {
        Python::attach(|py| {
            let _ = gate(py);
            for size in [0, 5, 6, 100] {
                let dict = new_dict(py, size).unwrap();
                assert!(dict.is_exact_instance_of::<PyDict>() && dict.is_empty());
                for i in 0..size {
                    dict.set_item(i, i).unwrap();
                }
                assert_eq!(dict.len(), size);
            }
        });
    }
}
