//! A type registered with JAX (`CustomType`) and the native versions of flatten functions
//! treeclone knows (`Known`), recognised when the type is classified; `node::known` runs them.

use crate::cpython::SlotReader;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};
use std::sync::atomic::{AtomicU8, Ordering};

/// A type registered with JAX through one of its registration functions.
pub struct CustomType {
    pub ty: Py<PyType>,
    /// `obj -> (children, aux_data)`
    pub flatten: Py<PyAny>,
    /// `(aux_data, children_tuple) -> obj`
    pub unflatten: Py<PyAny>,
    /// The native version of `flatten`, where treeclone knows the function (flax nnx's).
    pub known: Option<KnownFlatten>,
    /// Whether `flatten` is known to read nothing but the node's instance dict (equinox's
    /// generated flatten of the type: `TypeKind::EqxModule`), though it runs in Python.
    pub reads_only_dict: bool,
}

impl CustomType {
    /// Whether the type's flatten reads nothing but what `jit_partial`'s snapshot watches, so
    /// that an unchanged watch says the flatten would give the same children and aux data
    /// (`bound/reflatten.rs`): flax nnx's (`KnownFlatten::reads_only_watched`) and equinox's.
    pub fn reads_only_watched(&self) -> bool {
        self.reads_only_dict || (self.known.as_ref()).is_some_and(KnownFlatten::reads_only_watched)
    }
}

/// A flatten function treeclone knows, recognised when the type is classified (flax nnx's by
/// identity, register_dataclass's by its name and the fields it closes over).
pub enum Known {
    /// `flax.nnx.pytreelib.Pytree._pytree__flatten`.
    Pytree,
    /// `flax.nnx.variablelib._variable_flatten`, with where the type keeps the two slots it
    /// reads.
    Variable {
        value: SlotReader,
        metadata: SlotReader,
    },
    /// `flax.nnx.pytreelib._flatten_pytree_state`, with where the type keeps the slots its
    /// two properties read (`_initializing`, `_is_setup`).
    PytreeState {
        initializing: SlotReader,
        is_setup: SlotReader,
    },
    /// `flax.nnx.statelib._state_flatten`.
    State,
    /// `register_dataclass`'s `flatten_func`: children the `data` fields, aux a tuple of the
    /// `meta` fields (read first, as the function reads them).
    Dataclass {
        data: Vec<Py<PyString>>,
        meta: Vec<Py<PyString>>,
    },
}

/// Whether the native flatten of a type has been checked against its Python function.
pub struct KnownFlatten {
    pub known: Known,
    /// A `Check`, as its number (set once, by the first node of the type).
    check: AtomicU8,
}

/// What the first node of a type found, flattened both ways (`node::known::flatten`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Unchecked = 0,
    Agrees = 1,
    Differs = 2,
}

impl KnownFlatten {
    pub fn new(known: Known) -> Self {
        KnownFlatten {
            known,
            check: AtomicU8::new(Check::Unchecked as u8),
        }
    }

    /// Whether the type's flatten reads nothing but what `jit_partial`'s snapshot watches (the
    /// instance dict, the slots, the plain containers they hold, the class under its version
    /// tag): flax nnx's four functions, recognised by identity, which read `vars(obj)`
    /// (`_pytree__nodes` among it or on the class) and a Variable's two slots, natively or
    /// (a case the native version does not cover: an `nnx.List`'s int keys) in Python; unless
    /// the native version was found to differ from the function (a flax release that changed
    /// it). Not `register_dataclass`'s: its `getattr` of each field may run a property or a
    /// class's `__getattr__`, which can read anything.
    pub fn reads_only_watched(&self) -> bool {
        self.check() != Check::Differs && !matches!(self.known, Known::Dataclass { .. })
    }

    /// What the comparison with the Python function found so far.
    pub fn check(&self) -> Check {
        match self.check.load(Ordering::Relaxed) {
            0 => Check::Unchecked,
            1 => Check::Agrees,
            _ => Check::Differs,
        }
    }

    /// Record what the comparison with the Python function found.
    pub fn set_check(&self, agrees: bool) {
        let check = if agrees {
            Check::Agrees
        } else {
            Check::Differs
        };
        self.check.store(check as u8, Ordering::Relaxed);
    }
}
