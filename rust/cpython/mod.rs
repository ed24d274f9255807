//! The one gate to CPython's internals: every read of a private field (type version tags,
//! `tp_getattro`/`tp_setattro`/`tp_base`/`tp_mro`/`tp_dict`, member descriptors and the
//! slots they locate, PEP 509 dict versions), every unexported function (`_PyDict_NewPresized`,
//! the addresses of `slot_tp_getattr_hook` and `slot_tp_setattro` learnt from a probe class)
//! and every CPython-version gate of the crate is here.
//!
//! - `layouts.rs`: the reads themselves, each an `unsafe fn` with its `# Safety`; compiled
//!   only for an interpreter whose layouts were checked (build.rs's `cpython_layouts`:
//!   CPython 3.11 to 3.13 with the GIL, version-specific ABI), else `no_layouts.rs`, the same
//!   names with no body to run;
//! - `types.rs`, `members.rs`, `dicts.rs`: the safe wrappers and what is built on them (a
//!   type's version, a slot's place, `SlotReader`, the write-back's slot swap, a dict's
//!   version, a presized dict), each with Rust tests that compare it with the public API's
//!   answer on the interpreter the crate is built for.
//!
//! Every wrapper needs an [`Internals`], which only [`internals`] gives, and only where the
//! layouts are read in this process: compiled in, on the interpreter they were compiled for,
//! and not switched off by `TREECLONE_NO_CPYTHON_INTERNALS` (read once, at import). Without
//! one, callers take the public API instead: `jit_partial` flattens its bound arguments at
//! every call, the write-back sets attributes through `object.__setattr__`, nnx Variables are
//! read with `getattr`, dicts are made empty. Slower, never wrong (docs/semantics.md,
//! "CPython internals").

// Without the layouts every `Internals` is uninhabited: code past one is unreachable, by design.
#![cfg_attr(not(cpython_layouts), allow(unreachable_code, unused_variables))]

mod dicts;
mod members;
mod types;

#[cfg(cpython_layouts)]
mod layouts;
#[cfg(not(cpython_layouts))]
#[path = "no_layouts.rs"]
mod layouts;

pub use dicts::new_dict;
pub use members::{SlotAt, SlotReader};
pub use types::TypeVersion;

use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The environment variable that switches the reads off (any value but empty or `0`).
pub const SWITCH_OFF: &str = "TREECLONE_NO_CPYTHON_INTERNALS";

/// The CPython the crate was built for (`3.11`; `3.14t` free-threaded), from build.rs.
const BUILT_FOR: &str = env!("TREECLONE_BUILT_FOR");

/// Leave to read CPython's private layouts in this process: a proof, checked once, that the
/// reads are compiled in, run on the interpreter they were checked for and are not switched
/// off. Zero-sized: holding one costs nothing. Where the layouts are not compiled in it
/// cannot exist at all (`layouts::Verified` has no value), so no read can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Internals(layouts::Verified);

/// Whether the reads are on in this process (set once, by `init`, at import).
static ON: AtomicBool = AtomicBool::new(false);

/// Leave to read CPython's internals, if this process has it.
#[inline]
pub fn internals() -> Option<Internals> {
    layouts::verified(ON.load(Ordering::Relaxed)).map(Internals)
}

/// Where this process stands, as `treeclone._native.cpython_internals()` tells Python.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// The layouts are read.
    On,
    /// Switched off by `TREECLONE_NO_CPYTHON_INTERNALS`.
    SwitchedOff,
    /// Not compiled in, or compiled for another interpreter: this sentence says which.
    Unverified(String),
}

impl Gate {
    /// What decides the gate: whether the layouts are compiled in, the interpreter built for
    /// and the one running (`3.11`), and the switch's value.
    fn decide(compiled: bool, built_for: &str, running: &str, switch: Option<&str>) -> Gate {
        let slower = "jit_partial flattens its bound arguments at every call and write-backs \
                      set attributes through the public API: slower, same results";
        if !compiled {
            return Gate::Unverified(format!(
                "treeclone does not read the internals of CPython {running}: it was built \
                 without them (they are read where verified: 3.11 to 3.13, with the GIL): \
                 {slower}"
            ));
        }
        if built_for != running {
            return Gate::Unverified(format!(
                "treeclone was built for CPython {built_for} and runs on CPython {running}, \
                 whose internals it does not read: {slower}"
            ));
        }
        match switch {
            Some(value) if !value.is_empty() && value != "0" => Gate::SwitchedOff,
            _ => Gate::On,
        }
    }

    /// Warn where this gate is `Unverified` (`announce`).
    fn announce(&self, py: Python<'_>) -> PyResult<()> {
        if let Gate::Unverified(why) = self {
            let why = std::ffi::CString::new(why.as_str())?;
            PyErr::warn(py, &py.get_type::<PyRuntimeWarning>(), &why, 1)?;
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        match self {
            Gate::On => "on",
            Gate::SwitchedOff => "switched off",
            Gate::Unverified(_) => "unverified",
        }
    }
}

/// The gate of this process, decided at its first call (the module's import, `lib.rs`):
/// afterwards `internals` answers.
pub fn init(py: Python<'_>) -> &'static Gate {
    static GATE: OnceLock<Gate> = OnceLock::new();
    GATE.get_or_init(|| {
        let info = py.version_info();
        let flavour = if cfg!(Py_GIL_DISABLED) { "t" } else { "" };
        let running = format!("{}.{}{}", info.major, info.minor, flavour);
        let switch = std::env::var(SWITCH_OFF).ok();
        let gate = Gate::decide(
            cfg!(cpython_layouts),
            BUILT_FOR,
            &running,
            switch.as_deref(),
        );
        ON.store(gate == Gate::On, Ordering::Relaxed);
        gate
    })
}

/// Say once, at import, that the internals are not read where that is for want of
/// verification (a `RuntimeWarning` naming the interpreter; switched off on purpose, nothing
/// is said).
pub fn announce(py: Python<'_>) -> PyResult<()> {
    init(py).announce(py)
}

/// `(state, why)`: `("on", None)`, `("switched off", None)` (`TREECLONE_NO_CPYTHON_INTERNALS`)
/// or `("unverified", the sentence of the import's warning)`, decided at import.
#[pyfunction]
pub fn cpython_internals(py: Python<'_>) -> (&'static str, Option<String>) {
    let gate = init(py);
    let why = match gate {
        Gate::Unverified(why) => Some(why.clone()),
        _ => None,
    };
    (gate.name(), why)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(cpython_layouts)]
    use pyo3::types::PyDict;

    /// Leave to read, for the tests of the reads (the switch must not be set).
    #[cfg(cpython_layouts)]
    pub fn gate(py: Python<'_>) -> Internals {
        init(py);
        internals().expect("the reads are on (is TREECLONE_NO_CPYTHON_INTERNALS set?)")
    }

    /// What `code`, run in a fresh namespace, binds to `name`.
    #[cfg(cpython_layouts)]
    pub fn run<'py>(py: Python<'py>, code: &str, name: &str) -> Bound<'py, PyAny> {
        let namespace = PyDict::new(py);
        let code = std::ffi::CString::new(code).unwrap();
        py.run(&code, Some(&namespace), None).unwrap();
        namespace.get_item(name).unwrap().unwrap()
    }

    #[test]
    fn the_gate_opens_only_on_the_interpreter_checked_and_not_switched_off() {
        assert_eq!(Gate::decide(true, "3.11", "3.11", None), Gate::On);
        assert_eq!(Gate::decide(true, "3.11", "3.11", Some("0")), Gate::On);
        assert_eq!(Gate::decide(true, "3.11", "3.11", Some("")), Gate::On);
        assert_eq!(
            Gate::decide(true, "3.11", "3.11", Some("1")),
            Gate::SwitchedOff
        );
        let Gate::Unverified(why) = Gate::decide(false, "3.14", "3.14", Some("1")) else {
            panic!("a build without the layouts must be unverified");
        };
        assert!(why.contains("CPython 3.14:"), "{why}");
        let Gate::Unverified(why) = Gate::decide(true, "3.13", "3.14t", None) else {
            panic!("another interpreter than the one built for must be unverified");
        };
        assert!(
            why.contains("built for CPython 3.13 and runs on CPython 3.14t"),
            "{why}"
        );
    }

    #[test]
    fn an_unverified_interpreter_is_named_in_a_runtime_warning_and_nothing_else_is() {
        Python::attach(|py| {
            let warnings = py.import("warnings").unwrap();
            let caught = warnings.call_method0("catch_warnings").unwrap();
            caught.call_method0("__enter__").unwrap();
            warnings.call_method1("simplefilter", ("error",)).unwrap();
            let unverified = Gate::decide(false, "3.14", "3.14", None).announce(py);
            let quiet = [Gate::On, Gate::SwitchedOff].map(|gate| gate.announce(py).is_ok());
            let none = py.None();
            caught
                .call_method1("__exit__", (&none, &none, &none))
                .unwrap();
            let err = unverified.expect_err("a warning (an error under this filter)");
            assert!(err.is_instance_of::<PyRuntimeWarning>(py));
            assert!(err.value(py).to_string().contains("CPython 3.14"), "{err}");
            assert_eq!(quiet, [true, true]);
        });
    }

    #[test]
    fn leave_is_given_exactly_when_the_layouts_are_compiled_in_and_on() {
        Python::attach(|py| {
            let on = *init(py) == Gate::On;
            assert_eq!(internals().is_some(), on);
            if std::env::var(SWITCH_OFF).is_err() {
                assert_eq!(on, cfg!(cpython_layouts));
            }
        });
    }
}
