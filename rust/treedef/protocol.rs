//! Equality and hashing, shared by both treedef types.

use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::PyClass;
use std::hash::Hasher;
use std::sync::OnceLock;

/// A structure that compares node by node, as JAX compares treedefs.
pub trait Structure: PyClass + Sync {
    /// Where the hash is cached (structures are immutable).
    fn hash_cell(&self) -> &OnceLock<isize>;
    /// Feed what equality compares, except aux data (which need not hash), into `h`.
    fn hash_nodes(&self, py: Python<'_>, h: &mut impl Hasher) -> PyResult<()>;
    /// Node by node in post-order: an aux comparison that raises is reached (or not) exactly
    /// when JAX reaches it.
    fn same_nodes(&self, py: Python<'_>, other: &Self) -> PyResult<bool>;
}

/// `__richcmp__` against the same type: `==` and `!=`; NotImplemented otherwise.
pub fn richcmp<T: Structure>(
    py: Python<'_>,
    this: &T,
    other: &T,
    op: CompareOp,
) -> PyResult<Py<PyAny>> {
    let eq = this.same_nodes(py, other)?;
    Ok(match op {
        CompareOp::Eq => eq.into_pyobject(py)?.to_owned().into_any().unbind(),
        CompareOp::Ne => (!eq).into_pyobject(py)?.to_owned().into_any().unbind(),
        _ => py.NotImplemented(),
    })
}

/// `__hash__`, computed once.
pub fn hash<T: Structure>(py: Python<'_>, this: &T) -> PyResult<isize> {
    if let Some(h) = this.hash_cell().get() {
        return Ok(*h);
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    this.hash_nodes(py, &mut h)?;
    let h = h.finish() as isize;
    Ok(*this.hash_cell().get_or_init(|| h))
}
