//! `Snapshot`: what the containers of `jit_partial`'s bound arguments hold, by identity, so
//! that a call can tell cheaply whether anything changed them since they were flattened.
//!
//! Each container's items (a list's or dict's) and instance attributes are recorded as the
//! objects they are. A call compares them, in Rust: a leaf or child replaced, a key or
//! attribute added or removed, a list resized all show. For every container that is not an
//! exact list or dict, the snapshot also records its type and the type's version (`__class__`
//! can be reassigned; a flatten may read the class: a setting every instance shares, a
//! property hiding an attribute), its `__dict__` itself (it can be replaced wholesale), its
//! slots (read through their member descriptors), a dict subclass's key order (an
//! `OrderedDict`'s `move_to_end` leaves its items as they were), and the contents of the plain
//! containers (lists, dicts, sets, tuples, nested) its attributes hold that are not nodes of
//! the tree: a registered flatten may read its children or its aux data from them
//! (`self._store["w"]`, nnx's `_var_metadata`). A class without a version (CPython stops
//! giving new ones to a class changed very often) cannot be watched: such a snapshot is not
//! `checkable`. The size of JAX's registry is watched too: a type registered since the flatten
//! (a bound leaf's class made a node) changes what a flatten gives.
//!
//! What the watches say is enough only for flattens that read nothing else: flax nnx's, run
//! natively (`KnownFlatten::reads_only_watched`). Every other registered node (a flatten
//! written in Python, JAX's own for `OrderedDict` and `defaultdict`, `register_dataclass`'s)
//! may read C-level state (a `defaultdict`'s `default_factory`), another object's attributes
//! or a module-level setting, and a child being the same object as some watched value (a small
//! int, `True`, a cached array) does not say the flatten read it there: such a node is
//! flattened again, one level, at each check, and its children and aux data compared with
//! the recorded ones (`reflatten`). An nnx node with no state in reach (no `__dict__`, no
//! slots) is not checkable: the bound arguments are flattened again at each call instead. An
//! exact list's or dict's record must be its flatten's children (the very keys and values):
//! Python code that ran later in the same flatten (a registered flatten, another thread
//! meanwhile) may have changed it after it was read, and a record of that change would stand
//! for a cache that never saw it. For the same reason a dict whose version (PEP 509) says it
//! changed after the flatten began makes the snapshot uncheckable
//! (`Snapshot::flatten_and_take`).
//!
//! Type versions, slots read in place and dict versions are CPython internals (`cpython/`):
//! where they are off, no snapshot is checkable, and the bound arguments are flattened at
//! every call.
//!
//! After a call, the record follows the call's own write-back without reading the containers
//! again (`Snapshot::refresh`): each recorded value that is one of the bound leaves is
//! replaced by what the write-back left in that leaf's place (the call's new list of bound
//! leaves, in the order of the one the snapshot was taken with). Whatever else wrote into the
//! containers during the call (another thread, while the computation ran) is then not in the
//! record, and shows at the next `unchanged`.
//!
//! `treeclone.jit`'s cache of its leading arguments (`call/kept.rs`) takes the same snapshot
//! and then lets go of the arguments themselves (`Snapshot::release`): the record refers to
//! them weakly, and a check upgrades each reference (one whose object died says "changed").
//!
//! The files: `snapshot.rs` (`Snapshot` and its Python methods), `record.rs` (the take, node by
//! node), `watched.rs` (each watch and its check), `items.rs` (items compared by identity),
//! `slots.rs` (slots found and read), `plain.rs` (the plain containers attributes hold),
//! `follow.rs` (following a write-back), `reflatten.rs` (the flattens run again), `leaves.rs`
//! (the bound leaves between calls).

mod follow;
mod items;
mod leaves;
mod plain;
mod record;
mod reflatten;
mod slots;
mod snapshot;
mod watched;

pub use leaves::{any_identical, Taker};
pub use snapshot::Snapshot;
