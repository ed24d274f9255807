//! treeclone's native core: JAX-exact pytree flatten/unflatten, treedefs and key paths.

use pyo3::prelude::*;

mod api;
mod flatten;
mod keysort;
mod registry;
mod shared;
mod treedef;

// `gil_used = true`: the caches are guarded by mutexes, but user callbacks (flatten functions,
// is_leaf) run mid-traversal and the whole crate has only been reviewed under the GIL.
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<treedef::PyTreeDef>()?;
    m.add_class::<shared::SharedTreeDef>()?;
    m.add_class::<shared::CallPlan>()?;
    m.add_function(wrap_pyfunction!(shared::py_flatten_shared, m)?)?;
    m.add_function(wrap_pyfunction!(api::py_flatten, m)?)?;
    m.add_function(wrap_pyfunction!(api::leaves, m)?)?;
    m.add_function(wrap_pyfunction!(api::structure, m)?)?;
    m.add_function(wrap_pyfunction!(api::flatten_with_path, m)?)?;
    m.add_function(wrap_pyfunction!(api::unflatten, m)?)?;
    m.add_function(wrap_pyfunction!(api::tree_map, m)?)?;
    m.add_function(wrap_pyfunction!(api::is_leaf_object, m)?)?;
    m.add_function(wrap_pyfunction!(api::invalidate_registry_cache, m)?)?;
    m.add_function(wrap_pyfunction!(api::clear_key_order_cache, m)?)?;
    m.add_function(wrap_pyfunction!(api::check_jax, m)?)?;
    m.add_function(wrap_pyfunction!(api::treedef_tuple, m)?)?;
    m.add_function(wrap_pyfunction!(treedef::_treedef_from_state, m)?)?;
    Ok(())
}
