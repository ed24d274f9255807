//! The Python objects the core needs from `treeclone._jax_compat` (JAX's key types, its
//! registry, its keyed flatten), fetched once per interpreter.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

pub struct Compat {
    pub classify_type: Py<PyAny>,
    /// JAX's Python-side registry (a dict that only grows: its size tells of registrations).
    pub registry: Py<PyDict>,
    pub sequence_key: Py<PyAny>,
    pub dict_key: Py<PyAny>,
    pub getattr_key: Py<PyAny>,
    pub flattened_index_key: Py<PyAny>,
    pub flatten_one_level_with_keys: Py<PyAny>,
    pub keystr: Py<PyAny>,
    pub to_jax_node: Py<PyAny>,
    pub prefix_error: Py<PyAny>,
}

static COMPAT: PyOnceLock<Compat> = PyOnceLock::new();

pub fn compat(py: Python<'_>) -> PyResult<&Compat> {
    COMPAT.get_or_try_init(py, || {
        let m = py.import("treeclone._jax_compat")?;
        let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(m.getattr(name)?.unbind()) };
        Ok(Compat {
            classify_type: get("classify_type")?,
            registry: m.getattr("registry")?.cast_into::<PyDict>()?.unbind(),
            sequence_key: get("SequenceKey")?,
            dict_key: get("DictKey")?,
            getattr_key: get("GetAttrKey")?,
            flattened_index_key: get("FlattenedIndexKey")?,
            flatten_one_level_with_keys: get("flatten_one_level_with_keys")?,
            keystr: get("keystr")?,
            to_jax_node: get("to_jax_node")?,
            prefix_error: get("prefix_error")?,
        })
    })
}
