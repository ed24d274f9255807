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
//! 8. `call/`: `LeanCall`, `treeclone.jit`'s whole call under a policy in one native call, the
//!    native bases of `Jitted` and `JitPartial`, whose `__call__` they are, and a stage's call; `api.rs`: the
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
mod _native {
    use crate::call::{FlattenFailed, ShardedArguments};
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::{
        api::{
            check_jax, clear_key_order_cache, flatten_with_path, invalidate_registry_cache,
            is_leaf_object, leaves, py_check, py_check_arguments, py_flatten, structure, tree_map,
            treedef_tuple, unflatten,
        },
        bound::{any_identical, Snapshot, Taker},
        call::bound_args::{bound_advance, bound_join},
        call::running::{running_call, swap_running_call},
        call::{JitCore, LeanCall, PartialCore, ResultBox, StageCall, StaticArguments},
        cpython::cpython_internals,
        registry::TypeKind,
        sharing::{py_flatten_shared, EntryInfo, SharedTreeDef},
        treedef::serial::_treedef_from_state,
        treedef::{unflatten_floor, PyTreeDef},
        writeback::{CallPlan, Origin, Source},
    };

    /// Run once the exports above are added (adding them reads none of CPython's internals).
    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let py = m.py();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        // Decided before any call can read CPython's internals (`cpython/`).
        crate::cpython::announce(py)?;
        m.add("FlattenFailed", py.get_type::<FlattenFailed>())?;
        m.add("ShardedArguments", py.get_type::<ShardedArguments>())
    }
}
