//! treeclone's native core: JAX-exact pytree flatten/unflatten, treedefs and key paths, and
//! the identity-tracking flatten and write-back of the alias/strict policies.
//!
//! The modules form layers, lowest first: each uses only modules of the layers below it
//! (`tests/test_rust_layout.py` checks that their `crate::` paths form no cycle).
//!
//! 1. `cpython/`: the one gate to CPython's internals (private layouts, unexported functions,
//!    version gates), each read with its safety argument and a test, and the switch that turns
//!    them all off (then the public API is used); `keys/`: maps keyed by object address and
//!    dict keys in JAX's order;
//! 2. `registry/`: which types are nodes (JAX's registry, one fast path for builtins), the
//!    registered types and the flatten functions treeclone knows;
//! 3. `node/`: the node model (kinds with typed payloads), taking nodes apart and building them;
//! 4. `traverse/`: the one traversal engine, its cycle/depth guard, plain mode; `treedef/`:
//!    `PyTreeDef` (unflatten, flatten_up_to, equality, pickling, JAX conversion);
//! 5. `sharing/`: the identity-tracking mode and `SharedTreeDef`;
//! 6. `writeback/`: `CallPlan`, the all-or-nothing write into the caller's objects;
//! 7. `bound/`: `Snapshot`, the by-identity record of `jit_partial`'s bound arguments;
//! 8. `call/`: `LeanCall`, `treeclone.jit`'s whole call under a policy in one native call, and
//!    the native bases of `Jitted` and `JitPartial`, whose `__call__` they are; `api.rs`: the
//!    module's functions, converting arguments and delegating.
//!
//! This file only registers the module.

use pyo3::prelude::*;

mod api;
mod bound;
mod call;
mod cpython;
mod keys;
mod node;
mod registry;
mod sharing;
mod traverse;
mod treedef;
mod writeback;

// `gil_used = true`: the caches are guarded by mutexes, but user callbacks (flatten functions,
// is_leaf) run mid-traversal and the whole crate has only been reviewed under the GIL.
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Decided before anything can read CPython's internals (`cpython/`).
    cpython::announce(m.py())?;
    m.add_function(wrap_pyfunction!(cpython::cpython_internals, m)?)?;
    m.add_class::<registry::TypeKind>()?;
    m.add_class::<treedef::PyTreeDef>()?;
    m.add_class::<sharing::SharedTreeDef>()?;
    m.add_class::<sharing::EntryInfo>()?;
    m.add_class::<writeback::CallPlan>()?;
    m.add_class::<writeback::Source>()?;
    m.add_class::<writeback::Origin>()?;
    m.add_class::<bound::Snapshot>()?;
    m.add_class::<call::LeanCall>()?;
    m.add_class::<call::ResultBox>()?;
    m.add_class::<call::JitCore>()?;
    m.add_class::<call::PartialCore>()?;
    m.add_class::<call::StageCall>()?;
    m.add_class::<call::StaticArguments>()?;
    m.add("FlattenFailed", m.py().get_type::<call::FlattenFailed>())?;
    m.add(
        "ShardedArguments",
        m.py().get_type::<call::ShardedArguments>(),
    )?;
    m.add_function(wrap_pyfunction!(call::bound_args::bound_join, m)?)?;
    m.add_function(wrap_pyfunction!(call::bound_args::bound_advance, m)?)?;
    m.add_function(wrap_pyfunction!(call::running::running_call, m)?)?;
    m.add_function(wrap_pyfunction!(call::running::swap_running_call, m)?)?;
    m.add_function(wrap_pyfunction!(sharing::py_flatten_shared, m)?)?;
    m.add_class::<bound::Taker>()?;
    m.add_function(wrap_pyfunction!(bound::any_identical, m)?)?;
    m.add_function(wrap_pyfunction!(treedef::serial::_treedef_from_state, m)?)?;
    m.add_function(wrap_pyfunction!(treedef::unflatten_floor, m)?)?;
    api::register(m)
}
