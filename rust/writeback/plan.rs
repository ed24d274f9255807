//! `CallPlan`: what a traced call returns and writes, fixed at trace time, and `apply`, which
//! builds the results at every call and hands the in-place writes to `write.rs`.

use super::kept::{kept_subtrees, kept_writes, ref_targets, Kept};
use super::slots::SlotPlace;
use super::sources::{Origin, Outputs, Source};
use super::write::Write;
use crate::node::{build_node, Node};
use crate::sharing::{Entry, SharedTreeDef};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::sync::Mutex;

/// What a traced call returns and writes, fixed at trace time, applied at every call.
#[pyclass(frozen, module = "treeclone")]
pub struct CallPlan {
    pub(super) def: Py<SharedTreeDef>,
    /// By leaf slot (copied out of the `Source` objects given: read at every call).
    pub(super) sources: Vec<Source>,
    /// Per node: the caller's container it is (written back in place), or None (built fresh).
    /// Only `alias` plans have any.
    pub(super) origins: Vec<Option<Py<Origin>>>,
    /// Index of the root's child to return (the results part of `(inputs, results)`); None
    /// to return the root itself.
    pub(super) result_child: Option<usize>,
    /// `write_custom(obj, new_obj, attrs) -> undo` for custom nodes, from Python.
    pub(super) write_custom: Py<PyAny>,
    /// By entry: where a subtree the caller keeps starts (an index into `kept`); `apply`
    /// hands the caller's object over without visiting it entry by entry.
    pub(super) skips: Vec<Option<usize>>,
    pub(super) kept: Vec<Kept>,
    /// How many nodes the kept subtrees write, and how many children those have.
    pub(super) kept_writes: (usize, usize),
    /// By entry: whether a later `Ref` looks it up (empty when none does).
    pub(super) targets: Vec<bool>,
    /// By entry of the caller's structure: its leaf slot, for a leaf (the caller's current
    /// leaf is `input_leaves[slot]`, which `jit_partial` keeps up to date where its objects
    /// list is not); empty without `input_def`.
    pub(super) input_slots: Vec<Option<usize>>,
    /// Where attributes written directly are stored, by type version (`slots.rs`).
    pub(super) slot_places: Mutex<Vec<SlotPlace>>,
    /// Rule J31 (docs/semantics.md): `check(input_leaves, input_objects, outputs, writes)`,
    /// called before anything is written when the call runs inside a JAX transformation and
    /// an output is one of its tracers; `writes` lists each caller container to be written
    /// as `(its node in the caller's tree, its new children)`. It raises when a traced value
    /// would land in an object from outside that transformation.
    pub(super) enclosing: Option<Py<PyAny>>,
}

#[pymethods]
impl CallPlan {
    /// `sources`: a `Source` per leaf slot of `def`; `origins`: per node of `def`, its
    /// `Origin` in the caller's tree, or None; `input_def`: the structure of the caller's
    /// tree the origins point into (given, subtrees the function left alone are skipped).
    /// `enclosing`: rule J31's check of what is written inside a JAX transformation (see the
    /// field).
    #[new]
    #[pyo3(signature = (
        def, sources, origins, result_child, write_custom, input_def=None, enclosing=None
    ))]
    fn new(
        def: Py<SharedTreeDef>,
        sources: Vec<Py<Source>>,
        origins: Vec<Option<Py<Origin>>>,
        result_child: Option<usize>,
        write_custom: Py<PyAny>,
        input_def: Option<Py<SharedTreeDef>>,
        enclosing: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let d = def.get();
        if sources.len() != d.num_slots || origins.len() != d.entries.len() {
            return Err(PyValueError::new_err(
                "CallPlan: one source per leaf slot and one origin per node are needed",
            ));
        }
        let targets = ref_targets(d);
        let (skips, kept) = match &input_def {
            Some(input) => kept_subtrees(d, input.get(), &sources, &origins, &targets)?,
            None => (vec![None; d.entries.len()], Vec::new()),
        };
        let kept_writes = kept_writes(d, &kept);
        let input_slots = match &input_def {
            Some(input) => input
                .get()
                .entries
                .iter()
                .map(|e| match e {
                    Entry::Leaf(slot) => Some(*slot),
                    _ => None,
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(CallPlan {
            def,
            sources: sources.iter().map(|s| *s.get()).collect(),
            origins,
            result_child,
            write_custom,
            skips,
            kept,
            kept_writes,
            targets,
            input_slots,
            slot_places: Mutex::new(Vec::new()),
            enclosing,
        })
    }

    /// Build the results from the caller's `input_leaves` / `input_objects` (from
    /// `flatten_shared` of the call's arguments) and the computation's `outputs`, writing back
    /// into the caller's containers where the plan has origins. All writes happen or none does.
    pub(crate) fn apply<'py>(
        &self,
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
        outputs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = input_leaves.py();
        let def = self.def.get();
        let outputs = Outputs::of(outputs).ok_or_else(|| {
            PyTypeError::new_err("the computation's outputs must come as a list or tuple")
        })?;
        let call = CallValues {
            leaves: input_leaves,
            objects: input_objects,
            outputs: &outputs,
        };
        let mut out = Building::new(self);
        let mut i = 0;
        while i < def.entries.len() {
            if let Some(k) = self.skips[i] {
                let kept = &self.kept[k];
                self.take_kept(kept, &call, &mut out)?;
                out.stack.push(input_objects.get_item(kept.node)?);
                i = kept.root + 1;
                continue;
            }
            let obj = self.entry(py, i, &call, &mut out)?;
            if self.targets.get(i) == Some(&true) {
                out.built[i] = Some(obj.clone());
            }
            out.stack.push(obj);
            i += 1;
        }
        let root = out.stack.pop().expect("one root");
        self.check_enclosing(
            py,
            &out.writes,
            &out.children,
            input_leaves,
            input_objects,
            &outputs,
        )?;
        self.write_all(py, out.writes, &out.children, input_leaves, input_objects)?;
        match self.result_child {
            None => Ok(root),
            Some(i) => root.get_item(i),
        }
    }
}

/// What one call hands `CallPlan::apply`: the caller's leaves and objects at call start (from
/// `flatten_shared` of its arguments) and the computation's outputs.
pub(super) struct CallValues<'a, 'py> {
    leaves: &'a Bound<'py, PyList>,
    objects: &'a Bound<'py, PyList>,
    outputs: &'a Outputs<'py>,
}

impl<'py> CallValues<'_, 'py> {
    /// The result leaf `source` names.
    fn leaf(&self, source: Source) -> PyResult<Bound<'py, PyAny>> {
        match source {
            Source::Input { slot } => self.leaves.get_item(slot),
            Source::Output { index } => self.outputs.get(index),
        }
    }
}

/// What `CallPlan::apply` makes as it goes through the plan's entries.
pub(super) struct Building<'a, 'py> {
    /// Finished entries whose parent is not reached yet.
    stack: Vec<Bound<'py, PyAny>>,
    /// The in-place writes pending (checked all together before any is made).
    writes: Vec<Write<'a, 'py>>,
    /// The new children of all the writes (see `Write`).
    children: Vec<Bound<'py, PyAny>>,
    /// The objects a later `Ref` looks up, by entry.
    built: Vec<Option<Bound<'py, PyAny>>>,
}

impl Building<'_, '_> {
    fn new(plan: &CallPlan) -> Self {
        Building {
            stack: Vec::with_capacity(16),
            // Sized for the writes known at trace time (those of kept subtrees; there may be
            // more).
            writes: Vec::with_capacity(plan.kept_writes.0),
            children: Vec::with_capacity(plan.kept_writes.1),
            built: vec![None; plan.targets.len()],
        }
    }
}

impl CallPlan {
    /// The caller's own subtree `kept` (see `kept_subtrees`): only what the call writes in
    /// it, and what a later `Ref` looks up, is read.
    fn take_kept<'a, 'py>(
        &'a self,
        kept: &Kept,
        call: &CallValues<'_, 'py>,
        out: &mut Building<'a, 'py>,
    ) -> PyResult<()> {
        let def = self.def.get();
        for &(target, theirs) in &kept.targets {
            out.built[target] = Some(call.objects.get_item(theirs)?);
        }
        for &w in &kept.writes {
            let (Entry::Node(node), Some(o)) = (&def.entries[w], &self.origins[w]) else {
                return Err(PyValueError::new_err("CallPlan: a kept write is no node"));
            };
            let at = out.children.len();
            for c in w - node.arity..w {
                let Entry::Leaf(slot) = def.entries[c] else {
                    return Err(PyValueError::new_err("CallPlan: a kept write's child"));
                };
                out.children.push(call.leaf(self.sources[slot])?);
            }
            let original = call.objects.get_item(o.get().node)?;
            out.writes
                .push((original, node, o.get(), at..out.children.len()));
        }
        Ok(())
    }

    /// Entry `i` of the results, from the call's values and the finished entries on `out`'s
    /// stack (a node's children, which it takes).
    fn entry<'a, 'py>(
        &'a self,
        py: Python<'py>,
        i: usize,
        call: &CallValues<'_, 'py>,
        out: &mut Building<'a, 'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.def.get().entries[i] {
            Entry::Leaf(slot) => call.leaf(self.sources[*slot]),
            Entry::Ref(target) => out.built.get(*target).cloned().flatten().ok_or_else(|| {
                PyValueError::new_err("CallPlan: a reference to an entry not built")
            }),
            Entry::Node(node) => {
                let start = out.stack.len() - node.arity;
                match self.origins[i].as_ref().map(Py::get) {
                    None => build_node(py, &node.kind, out.stack.drain(start..)),
                    Some(o) => self.caller_node(py, node, o, start, call, out),
                }
            }
        }
    }

    /// A node of the results that is the caller's container `o.node`, its children on `out`'s
    /// stack from `start`: the caller's object untouched when its data and children are as
    /// they were, else written in place where it can be (pending with the other writes), else
    /// built fresh.
    fn caller_node<'a, 'py>(
        &self,
        py: Python<'py>,
        node: &'a Node,
        o: &'a Origin,
        start: usize,
        call: &CallValues<'_, 'py>,
        out: &mut Building<'a, 'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let original = call.objects.get_item(o.node)?;
        let mut unchanged = o.same_data && o.old_children.len() == node.arity;
        if unchanged {
            for (new, &old) in out.stack[start..].iter().zip(&o.old_children) {
                if !new.is(self.old_child(call.leaves, call.objects, old)?) {
                    unchanged = false;
                    break;
                }
            }
        }
        if unchanged {
            out.stack.truncate(start);
            Ok(original)
        } else if o.writable {
            let at = out.children.len();
            out.children.extend(out.stack.drain(start..));
            out.writes
                .push((original.clone(), node, o, at..out.children.len()));
            Ok(original)
        } else {
            build_node(py, &node.kind, out.stack.drain(start..))
        }
    }
}
