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
    /// `jax.core.Tracer`.
    pub tracer: Py<PyAny>,
    /// JAX's tracing context and the type of its top-level trace (None where the installed
    /// JAX has not these internals: see [`at_top_level`]).
    pub trace_ctx: Option<Py<PyAny>>,
    pub eval_trace: Option<Py<PyAny>>,
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
            tracer: get("Tracer")?,
            trace_ctx: present(m.getattr("trace_ctx")?)?,
            eval_trace: present(m.getattr("EvalTrace")?)?,
        })
    })
}

/// `obj`, unless it is `_jax_compat`'s stand-in for an internal the installed JAX lacks
/// (false as a bool).
fn present(obj: Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    Ok(obj.is_truthy()?.then(|| obj.unbind()))
}

/// Whether no JAX transformation is tracing in this thread now (JAX's current trace is its
/// top-level `EvalTrace`). False where that cannot be read: callers then look at the values.
pub fn at_top_level(py: Python<'_>) -> PyResult<bool> {
    let c = compat(py)?;
    let (Some(ctx), Some(eval)) = (&c.trace_ctx, &c.eval_trace) else {
        return Ok(false);
    };
    let trace = ctx.bind(py).getattr(pyo3::intern!(py, "trace"))?;
    Ok(trace.get_type().is(eval.bind(py)))
}
