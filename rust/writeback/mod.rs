//! Write-back: `CallPlan.apply` rebuilds a traced function's results and, for `alias`, writes
//! the new contents of the caller's containers back into those very objects, all or nothing
//! (an undo log puts back what was written when a later write fails).

use crate::cpython::internals;
use crate::node::{build_node, Node, NodeKind};
use crate::registry::{at_top_level, compat};
use crate::sharing::{Entry, SharedTreeDef};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PySet, PySlice, PyString, PyTuple};
use std::ops::Range;
use std::sync::Mutex;

mod slots;
use slots::{swap_slot, SlotPlace};

/// Where a result leaf comes from.
#[pyclass(frozen, skip_from_py_object, module = "treeclone._native")]
#[derive(Clone, Copy)]
pub enum Source {
    /// The caller's input leaf in this slot (unchanged by the function: not materialized).
    Input { slot: usize },
    /// The computation's output at this index.
    Output { index: usize },
}

/// How a node of the results relates to the caller's tree (for write-back).
#[pyclass(frozen, get_all, module = "treeclone._native")]
pub struct Origin {
    /// Node index in the caller's tree.
    node: usize,
    /// Node indices of its children in the caller's tree.
    old_children: Vec<usize>,
    /// Whether its node data (dict keys, custom aux) is unchanged.
    same_data: bool,
    /// Whether it can be updated in place (list, dict, writable custom object).
    writable: bool,
    /// A dict's keys in the order the function left them (insertion order of new keys).
    key_order: Option<Py<PyTuple>>,
    /// Whether the function reordered the dict keys it kept (else they keep the caller's
    /// order, which the function may not have seen: a flatten may sort them).
    reordered: bool,
    /// A custom node's attributes the function changed (None: let `write_custom` decide).
    attrs: Option<Py<PyTuple>>,
    /// When every changed attribute of a custom node holds one of its children as it is (the
    /// node's unflatten stores child `j` in attribute `name`, as nnx's `Variable` and modules
    /// do): `(name, j)` for each, set directly, without rebuilding the node or calling Python.
    direct: Option<Vec<(Py<PyString>, usize)>>,
    /// Whether the node's items can be written entry by entry (rule J20): a list's item `j`
    /// at call start is `old_children[j]`; a dict's value for `old_keys[j]` is
    /// `old_children[j]`. Only the entries the function changed are then written. False: the
    /// whole container is refilled (a subclass whose unflatten converts its items).
    by_entry: bool,
    /// A dict's (or dict subclass's) keys at call start, in the order of `old_children`.
    old_keys: Option<Py<PyTuple>>,
}

#[pymethods]
impl Origin {
    #[new]
    #[pyo3(signature = (
        *, node, old_children, same_data, writable, key_order=None, reordered=true, attrs=None,
        direct=None, by_entry=false, old_keys=None
    ))]
    #[allow(clippy::too_many_arguments)] // keyword-only, each one a named field
    fn new(
        node: usize,
        old_children: Vec<usize>,
        same_data: bool,
        writable: bool,
        key_order: Option<Py<PyTuple>>,
        reordered: bool,
        attrs: Option<Py<PyTuple>>,
        direct: Option<Vec<(Py<PyString>, usize)>>,
        by_entry: bool,
        old_keys: Option<Py<PyTuple>>,
    ) -> Self {
        Origin {
            node,
            old_children,
            same_data,
            writable,
            key_order,
            reordered,
            attrs,
            direct,
            by_entry,
            old_keys,
        }
    }
}

/// The computation's outputs, as jax hands them over: a list or a tuple.
pub enum Outputs<'py> {
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
}

impl<'py> Outputs<'py> {
    /// `outputs` as a list or a tuple (asked by type: a derived extraction would make and
    /// drop an error at every call that hands over the second kind); None if it is neither.
    pub fn of(outputs: &Bound<'py, PyAny>) -> Option<Self> {
        if let Ok(tuple) = outputs.cast::<PyTuple>() {
            return Some(Outputs::Tuple(tuple.clone()));
        }
        outputs
            .cast::<PyList>()
            .ok()
            .map(|list| Outputs::List(list.clone()))
    }

    pub fn get(&self, i: usize) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Outputs::List(list) => list.get_item(i),
            Outputs::Tuple(tuple) => tuple.get_item(i),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Outputs::List(list) => list.len(),
            Outputs::Tuple(tuple) => tuple.len(),
        }
    }
}

/// A pending in-place write: the caller's object, its node, its origin, and where its new
/// children are among all the writes' children (one vector for all: a call of an nnx step
/// writes hundreds of Variables, and a vector for each cost an allocation each).
type Write<'a, 'py> = (Bound<'py, PyAny>, &'a Node, &'a Origin, Range<usize>);

/// What a traced call returns and writes, fixed at trace time, applied at every call.
#[pyclass(frozen, module = "treeclone")]
pub struct CallPlan {
    def: Py<SharedTreeDef>,
    /// By leaf slot (copied out of the `Source` objects given: read at every call).
    sources: Vec<Source>,
    /// Per node: the caller's container it is (written back in place), or None (built fresh).
    /// Only `alias` plans have any.
    origins: Vec<Option<Py<Origin>>>,
    /// Index of the root's child to return (the results part of `(inputs, results)`); None
    /// to return the root itself.
    result_child: Option<usize>,
    /// `write_custom(obj, new_obj, attrs) -> undo` for custom nodes, from Python.
    write_custom: Py<PyAny>,
    /// By entry: where a subtree the caller keeps starts (an index into `kept`); `apply`
    /// hands the caller's object over without visiting it entry by entry.
    skips: Vec<Option<usize>>,
    kept: Vec<Kept>,
    /// How many nodes the kept subtrees write, and how many children those have.
    kept_writes: (usize, usize),
    /// By entry: whether a later `Ref` looks it up (empty when none does).
    targets: Vec<bool>,
    /// By entry of the caller's structure: its leaf slot, for a leaf (the caller's current
    /// leaf is `input_leaves[slot]`, which `jit_partial` keeps up to date where its objects
    /// list is not); empty without `input_def`.
    input_slots: Vec<Option<usize>>,
    /// Where attributes written directly are stored, by type version (`slots.rs`).
    slot_places: Mutex<Vec<SlotPlace>>,
    /// Rule J31 (docs/semantics.md): `check(input_leaves, input_objects, outputs, writes)`,
    /// called before anything is written when the call runs inside a JAX transformation and
    /// an output is one of its tracers; `writes` lists each caller container to be written
    /// as `(its node in the caller's tree, its new children)`. It raises when a traced value
    /// would land in an object from outside that transformation.
    enclosing: Option<Py<PyAny>>,
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
        py: Python<'py>,
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
        outputs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let def = self.def.get();
        let outputs = Outputs::of(outputs).ok_or_else(|| {
            PyTypeError::new_err("the computation's outputs must come as a list or tuple")
        })?;
        // Sized for the writes known at trace time (those of kept subtrees; there may be more).
        let mut writes: Vec<Write<'_, 'py>> = Vec::with_capacity(self.kept_writes.0);
        let mut children: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.kept_writes.1);
        // The objects a later `Ref` looks up, by entry.
        let mut built: Vec<Option<Bound<'py, PyAny>>> = vec![None; self.targets.len()];
        let leaf = |slot: usize| match self.sources[slot] {
            Source::Input { slot } => input_leaves.get_item(slot),
            Source::Output { index } => outputs.get(index),
        };
        let mut stack: Vec<Bound<'py, PyAny>> = Vec::with_capacity(16);
        let mut i = 0;
        while i < def.entries.len() {
            if let Some(k) = self.skips[i] {
                // The caller's own subtree (see `kept_subtrees`): only what the call writes
                // in it, and what a later `Ref` looks up, is read.
                let kept = &self.kept[k];
                for &(target, theirs) in &kept.targets {
                    built[target] = Some(input_objects.get_item(theirs)?);
                }
                for &w in &kept.writes {
                    let (Entry::Node(node), Some(o)) = (&def.entries[w], &self.origins[w]) else {
                        return Err(PyValueError::new_err("CallPlan: a kept write is no node"));
                    };
                    let at = children.len();
                    for c in w - node.arity..w {
                        let Entry::Leaf(slot) = def.entries[c] else {
                            return Err(PyValueError::new_err("CallPlan: a kept write's child"));
                        };
                        children.push(leaf(slot)?);
                    }
                    let original = input_objects.get_item(o.get().node)?;
                    writes.push((original, node, o.get(), at..children.len()));
                }
                stack.push(input_objects.get_item(kept.node)?);
                i = kept.root + 1;
                continue;
            }
            let (entry, origin) = (&def.entries[i], self.origins[i].as_ref().map(Py::get));
            let at = i;
            i += 1;
            let obj = match entry {
                Entry::Leaf(slot) => leaf(*slot)?,
                Entry::Ref(target) => built.get(*target).cloned().flatten().ok_or_else(|| {
                    PyValueError::new_err("CallPlan: a reference to an entry not built")
                })?,
                Entry::Node(node) => {
                    let start = stack.len() - node.arity;
                    match origin {
                        None => build_node(py, &node.kind, stack.drain(start..))?,
                        Some(o) => {
                            let original = input_objects.get_item(o.node)?;
                            let mut unchanged = o.same_data && o.old_children.len() == node.arity;
                            if unchanged {
                                for (new, &old) in stack[start..].iter().zip(&o.old_children) {
                                    if !new.is(self.old_child(input_leaves, input_objects, old)?) {
                                        unchanged = false;
                                        break;
                                    }
                                }
                            }
                            if unchanged {
                                stack.truncate(start);
                                original
                            } else if o.writable {
                                let at = children.len();
                                children.extend(stack.drain(start..));
                                writes.push((original.clone(), node, o, at..children.len()));
                                original
                            } else {
                                build_node(py, &node.kind, stack.drain(start..))?
                            }
                        }
                    }
                }
            };
            if self.targets.get(at) == Some(&true) {
                built[at] = Some(obj.clone());
            }
            stack.push(obj);
        }
        let root = stack.pop().expect("one root");
        self.check_enclosing(
            py,
            &writes,
            &children,
            input_leaves,
            input_objects,
            &outputs,
        )?;
        self.write_all(py, writes, &children, input_leaves, input_objects)?;
        match self.result_child {
            None => Ok(root),
            Some(i) => root.get_item(i),
        }
    }
}

/// A subtree of the results that is the caller's own object, kept (see `kept_subtrees`).
struct Kept {
    /// Its root entry (it starts at the entry whose `skips` names it).
    root: usize,
    /// The caller's node it is.
    node: usize,
    /// The nodes in it written in place, in entry order: custom nodes whose children are all
    /// leaves, set directly as attributes (an nnx Variable's value).
    writes: Vec<usize>,
    /// The entries in it a later `Ref` looks up, each with the caller's node it is.
    targets: Vec<(usize, usize)>,
}

/// How many nodes the `kept` subtrees of `def` write, and how many children those have.
fn kept_writes(def: &SharedTreeDef, kept: &[Kept]) -> (usize, usize) {
    let writes = kept.iter().flat_map(|k| &k.writes);
    let children = writes.clone().map(|&w| def.entries[w].size() - 1).sum();
    (writes.count(), children)
}

/// By entry of `def`: whether a `Ref` looks it up (empty when none does).
fn ref_targets(def: &SharedTreeDef) -> Vec<bool> {
    if !def.has_refs {
        return Vec::new();
    }
    let mut targets = vec![false; def.entries.len()];
    for entry in &def.entries {
        if let Entry::Ref(target) = entry {
            if let Some(t) = targets.get_mut(*target) {
                *t = true;
            }
        }
    }
    targets
}

/// The subtrees of `def` the trace proved to be the caller's own objects, as `apply` would
/// find at every call (a plan only ever meets calls of the structure it was traced with):
/// a node is kept when its origin keeps its data and each child is the caller's child at
/// that place (a leaf handed back from the same slot, a kept node), or when it is a custom
/// node written in place directly whose children are all leaves (not kept so, it has new data
/// or a leaf from another slot or the outputs, never the old leaf: `apply` would write it at
/// every call and hand the caller's object over). A `Ref` child is left to `apply`. Marked at
/// the first entry of each largest subtree of kept nodes whose root keeps its data: its layout
/// is the caller's, entry for entry, so `apply` reads only its writes and the entries a later
/// `Ref` looks up.
fn kept_subtrees(
    def: &SharedTreeDef,
    input: &SharedTreeDef,
    sources: &[Py<Source>],
    origins: &[Option<Py<Origin>>],
    targets: &[bool],
) -> PyResult<(Vec<Option<usize>>, Vec<Kept>)> {
    let n = def.entries.len();
    let mut same = vec![false; n];
    let mut written = vec![false; n];
    let mut covered = vec![false; n];
    for (i, entry) in def.entries.iter().enumerate() {
        let (Entry::Node(node), Some(origin)) = (entry, origins[i].as_ref().map(Py::get)) else {
            continue;
        };
        if origin.old_children.len() != node.arity {
            continue;
        }
        let children = def.child_indices(i)?;
        let pairs = || children.iter().zip(&origin.old_children);
        let kept = pairs().all(
            |(&c, &old)| match (&def.entries[c], input.entries.get(old)) {
                (Entry::Leaf(slot), Some(Entry::Leaf(theirs))) => matches!(
                    sources[*slot].get(),
                    Source::Input { slot: s } if s == theirs
                ),
                (Entry::Node(_), _) => {
                    (same[c] || written[c])
                        && origins[c].as_ref().is_some_and(|o| o.get().node == old)
                }
                _ => false,
            },
        );
        if kept && origin.same_data {
            same[i] = true;
            for c in children {
                covered[c] = true;
            }
        } else if origin.writable
            && origin.direct.is_some()
            && matches!(node.kind, NodeKind::Custom(..))
            && pairs().all(|(&c, &old)| {
                matches!(
                    (&def.entries[c], input.entries.get(old)),
                    (Entry::Leaf(_), Some(Entry::Leaf(_)))
                )
            })
        {
            written[i] = true;
        }
    }
    let mut skips = vec![None; n];
    let mut kept = Vec::new();
    for root in (0..n).filter(|&i| same[i] && !covered[i]) {
        let size = def.entries[root].size();
        let (first, node) = (
            root + 1 - size,
            origins[root].as_ref().map_or(0, |o| o.get().node),
        );
        let theirs = node + 1 - size; // the caller's first entry of it
        skips[first] = Some(kept.len());
        kept.push(Kept {
            root,
            node,
            writes: (first..=root).filter(|&e| written[e]).collect(),
            targets: (first..=root)
                .filter(|&e| targets.get(e) == Some(&true))
                .map(|e| (e, e - first + theirs))
                .collect(),
        });
    }
    Ok((skips, kept))
}

/// How to put a container back as it was.
enum Undo<'py> {
    /// A list (or list subclass) and its old items.
    List(Bound<'py, PyAny>, Bound<'py, PyList>),
    /// A dict (or dict subclass) and its old items, in order.
    Mapping(
        Bound<'py, PyAny>,
        Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    ),
    /// A list written entry by entry: the items set, with their old values, and the tail
    /// replaced when it was resized (where it starts, the new tail's length, the old tail).
    ListEntries(
        Bound<'py, PyAny>,
        Vec<(usize, Bound<'py, PyAny>)>,
        Option<(usize, usize, Bound<'py, PyAny>)>,
    ),
    /// A dict written entry by entry: the keys set or deleted, with their old values (None:
    /// absent), and its keys in order before.
    MappingEntries(
        Bound<'py, PyAny>,
        Vec<(Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)>,
        Vec<Bound<'py, PyAny>>,
    ),
    /// What `write_custom` returned.
    Call(Bound<'py, PyAny>),
    /// An object and the attributes set directly, with their old values (None: it had none).
    Attributes(
        Bound<'py, PyAny>,
        Vec<(Bound<'py, PyString>, Option<Bound<'py, PyAny>>)>,
    ),
    /// The same for one attribute (an nnx Variable's value): no allocation at each write.
    Attribute(
        Bound<'py, PyAny>,
        Bound<'py, PyString>,
        Option<Bound<'py, PyAny>>,
    ),
}

impl Undo<'_> {
    fn run(self) -> PyResult<()> {
        match self {
            Undo::List(l, old) => set_list_items(&l, old.as_any()),
            Undo::Mapping(d, old) => set_mapping_items(&d, old),
            Undo::ListEntries(l, set, tail) => {
                if let Some((start, len, old)) = tail {
                    let slice = PySlice::new(l.py(), start as isize, (start + len) as isize, 1);
                    l.set_item(slice, old)?;
                }
                for (j, v) in set.into_iter().rev() {
                    l.set_item(j, v)?;
                }
                Ok(())
            }
            Undo::MappingEntries(d, ops, order) => {
                for (k, v) in ops.into_iter().rev() {
                    match v {
                        Some(v) => d.set_item(k, v)?,
                        None => {
                            if raw_get(&d, &k)?.is_some() {
                                d.del_item(k)?;
                            }
                        }
                    }
                }
                put_in_order(&d, &order)
            }
            Undo::Call(f) => f.call0().map(|_| ()),
            Undo::Attributes(obj, old) => restore_attributes(&obj, old),
            Undo::Attribute(obj, name, old) => restore_attributes(&obj, vec![(name, old)]),
        }
    }
}

impl CallPlan {
    /// Rule J31, before anything is written: inside a JAX transformation (not at the top
    /// level, one look at JAX's trace state), when an output is a tracer, `enclosing` is
    /// handed the pending writes and raises for a traced value bound for an object from
    /// outside the transformation.
    fn check_enclosing<'py>(
        &self,
        py: Python<'py>,
        writes: &[Write<'_, 'py>],
        children: &[Bound<'py, PyAny>],
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
        outputs: &Outputs<'py>,
    ) -> PyResult<()> {
        let Some(check) = &self.enclosing else {
            return Ok(());
        };
        if writes.is_empty() || at_top_level(py)? {
            return Ok(());
        }
        let tracer = compat(py)?.tracer.bind(py);
        let mut traced = false;
        for i in 0..outputs.len() {
            if outputs.get(i)?.is_instance(tracer)? {
                traced = true;
                break;
            }
        }
        if !traced {
            return Ok(());
        }
        let pending = PyList::empty(py);
        for (_, _, origin, at) in writes {
            let new = PyTuple::new(py, &children[at.clone()])?;
            pending.append((origin.node, new))?;
        }
        let outputs = match outputs {
            Outputs::List(list) => list.clone().into_any(),
            Outputs::Tuple(tuple) => tuple.clone().into_any(),
        };
        check
            .bind(py)
            .call1((input_leaves, input_objects, outputs, pending))?;
        Ok(())
    }

    /// What the caller's tree held at entry `old` when the call started.
    fn old_child<'py>(
        &self,
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
        old: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.input_slots.get(old) {
            Some(Some(slot)) => input_leaves.get_item(*slot),
            _ => input_objects.get_item(old),
        }
    }

    /// For an origin written entry by entry: the caller's children at call start, by place.
    fn old_children<'py>(
        &self,
        origin: &Origin,
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        if !origin.by_entry {
            return Ok(None);
        }
        let old = origin
            .old_children
            .iter()
            .map(|&c| self.old_child(input_leaves, input_objects, c))
            .collect::<PyResult<_>>()?;
        Ok(Some(old))
    }

    fn write_all<'py>(
        &self,
        py: Python<'py>,
        writes: Vec<Write<'_, 'py>>,
        children: &[Bound<'py, PyAny>],
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
    ) -> PyResult<()> {
        let mut done: Vec<Undo<'py>> = Vec::with_capacity(writes.len());
        // A copy: the lock is not held while Python code may run (a finalizer, a setter).
        let mut places = match self.slot_places.lock() {
            Ok(places) => places.clone(),
            Err(_) => Vec::new(),
        };
        let known = places.len();
        for (obj, node, origin, at) in writes {
            let mut write = Writing {
                plan: self,
                done: &mut done,
                places: &mut places,
            };
            let written = self
                .old_children(origin, input_leaves, input_objects)
                .and_then(|old| write_one(&obj, node, origin, &children[at], old, &mut write));
            if let Err(err) = written {
                // Put back what was written, newest first; the first error is the one
                // reported, so a failing undo is only attached as context.
                for undo in done.into_iter().rev() {
                    if let Err(e) = undo.run() {
                        err.set_cause(py, Some(e));
                    }
                }
                return Err(err);
            }
        }
        if places.len() != known {
            if let Ok(mut kept) = self.slot_places.lock() {
                *kept = places;
            }
        }
        Ok(())
    }
}

/// `object.__setattr__`, which sets an attribute as `write_custom` does: past a class's own
/// `__setattr__` (frozen dataclasses, nnx's trace-level checks), as if the function had run on
/// the caller's object.
fn object_setattr(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static SETATTR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    SETATTR
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.get_type::<PyAny>().getattr("__setattr__")?.unbind())
        })
        .map(|f| f.bind(py))
}

/// `object.__setattr__(obj, name, value)`. Called for every attribute a write-back sets (each
/// nnx Variable written): where that is the generic setter (`generic_setattr_applies`, read
/// in CPython's internals), it is called directly, without the Python call (a tuple, a bound
/// method-wrapper and a second tuple each time).
fn set_attribute<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    value: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let py = obj.py();
    let generic = match internals() {
        Some(gate) => gate.generic_setattr_applies(obj)?,
        None => false,
    };
    if !generic {
        return object_setattr(py)?.call1((obj, name, value)).map(|_| ());
    }
    // SAFETY: all three are alive (borrowed for the call) and the GIL is held; the setter may
    // run Python code (a descriptor's `__set__`, the finalizer of the value replaced), which
    // takes references of its own to what it keeps.
    if unsafe { pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) }
        < 0
    {
        return Err(PyErr::fetch(py));
    }
    Ok(())
}

/// Put back attributes set by [`write_attributes`]: old values, and none where there was none.
fn restore_attributes<'py>(
    obj: &Bound<'py, PyAny>,
    old: Vec<(Bound<'py, PyString>, Option<Bound<'py, PyAny>>)>,
) -> PyResult<()> {
    let py = obj.py();
    for (name, value) in old.into_iter().rev() {
        match value {
            Some(v) => set_attribute(obj, &name, &v)?,
            None => {
                let delattr = py.get_type::<PyAny>().getattr("__delattr__")?;
                if let Err(e) = delattr.call1((obj, name)) {
                    if !e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) {
                        return Err(e);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Set `obj.<name> = children[j]` for each `(name, j)` of `direct`; returns how to undo it
/// (also the part done when a later attribute fails).
fn write_attributes<'py>(
    obj: &Bound<'py, PyAny>,
    direct: &[(Py<PyString>, usize)],
    children: &[Bound<'py, PyAny>],
    places: &mut Vec<SlotPlace>,
) -> PyResult<Undo<'py>> {
    if let [(name, j)] = direct {
        let (name, before) = write_attribute(obj, name, *j, children, places)?;
        return Ok(Undo::Attribute(obj.clone(), name, before));
    }
    let mut old = Vec::with_capacity(direct.len());
    for (name, j) in direct {
        match write_attribute(obj, name, *j, children, places) {
            Ok(done) => old.push(done),
            Err(e) => {
                restore_attributes(obj, old)?;
                return Err(e);
            }
        }
    }
    Ok(Undo::Attributes(obj.clone(), old))
}

/// Set `obj.<name> = children[j]`; returns the name and the value it replaced (None: none).
fn write_attribute<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Py<PyString>,
    j: usize,
    children: &[Bound<'py, PyAny>],
    places: &mut Vec<SlotPlace>,
) -> PyResult<(Bound<'py, PyString>, Option<Bound<'py, PyAny>>)> {
    let py = obj.py();
    let name = name.bind(py);
    let Some(value) = children.get(j) else {
        return Err(PyValueError::new_err(
            "CallPlan: a direct write names a child the node does not have",
        ));
    };
    if let Some(before) = swap_slot(obj, name, value, places)? {
        return Ok((name.clone(), before));
    }
    // Read as `object.__getattribute__` reads it, the value `set_attribute`'s generic setter
    // replaces (and the undo puts back), past a class's own `__getattr__` hook.
    // SAFETY: `obj` and `name` are alive (borrowed) and the GIL is held; the result is a new
    // reference or NULL with an exception set, which `from_owned_ptr_or_err` takes over.
    let read = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyObject_GenericGetAttr(obj.as_ptr(), name.as_ptr()),
        )
    };
    let before = match read {
        Ok(v) => Some(v),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => None,
        Err(e) => return Err(e),
    };
    set_attribute(obj, name, value)?;
    Ok((name.clone(), before))
}

/// Replace all items of a list (or list subclass, through its own `__setitem__`).
fn set_list_items(list: &Bound<'_, PyAny>, items: &Bound<'_, PyAny>) -> PyResult<()> {
    list.set_item(PySlice::full(list.py()), items)
}

/// Give the list (or list subclass) `list` the items of `items` in place; returns how to undo
/// it.
fn write_list<'py>(list: &Bound<'py, PyAny>, items: &Bound<'py, PyAny>) -> PyResult<Undo<'py>> {
    let old = PyList::new(list.py(), list.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
    set_list_items(list, items)?;
    Ok(Undo::List(list.clone(), old))
}

/// Give the list (or list subclass) `list` the items `new` where they differ from `old`, its
/// items at call start, by identity (rule J20): the indices the function changed are set one
/// by one, and a resized list gets its tail from the shorter length on replaced by one slice
/// assignment; everything else is left as it is now. Returns how to undo it.
fn write_list_entries<'py>(
    list: &Bound<'py, PyAny>,
    new: &[Bound<'py, PyAny>],
    old: &[Bound<'py, PyAny>],
) -> PyResult<Undo<'py>> {
    let py = list.py();
    let common = new.len().min(old.len());
    let mut set = Vec::new();
    let mut tail = None;
    let mut apply = || -> PyResult<()> {
        for j in 0..common {
            if !new[j].is(&old[j]) {
                let before = list.get_item(j)?;
                list.set_item(j, &new[j])?;
                set.push((j, before));
            }
        }
        if new.len() != old.len() {
            let slice = PySlice::new(py, common as isize, old.len() as isize, 1);
            let before = list.get_item(&slice)?;
            list.set_item(&slice, PyList::new(py, &new[common..])?)?;
            tail = Some((common, new.len() - common, before));
        }
        Ok(())
    };
    let result = apply();
    let undo = Undo::ListEntries(list.clone(), set, tail);
    match result {
        Ok(()) => Ok(undo),
        Err(e) => {
            undo.run()?;
            Err(e)
        }
    }
}

/// The value stored for `key` in the dict (or dict subclass) `dict`, read as stored (no
/// `__getitem__`, no `__missing__`), or None.
fn raw_get<'py>(
    dict: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    dict.cast::<PyDict>()?.get_item(key)
}

/// Put the dict's keys in `order` (those it still holds; keys it holds that `order` lacks
/// follow, in their order), moving each key with its value as it is now.
fn put_in_order<'py>(dict: &Bound<'py, PyAny>, order: &[Bound<'py, PyAny>]) -> PyResult<()> {
    let py = dict.py();
    let now = PyList::new(py, dict.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
    let wanted = PyList::empty(py);
    let placed = PySet::empty(py)?;
    for k in order {
        if raw_get(dict, k)?.is_some() && !placed.contains(k)? {
            wanted.append(k)?;
            placed.add(k)?;
        }
    }
    for k in now.iter() {
        if !placed.contains(&k)? {
            wanted.append(&k)?;
        }
    }
    if now.as_any().eq(&wanted)? {
        return Ok(());
    }
    for k in wanted.iter() {
        let v = dict.call_method1("pop", (&k,))?;
        dict.set_item(&k, v)?;
    }
    Ok(())
}

/// Give the dict (or dict subclass) `dict` the items `new` where they differ from what it
/// held at call start (`old_keys[j]` held `old[j]`), by identity (rule J20): keys the function
/// removed are deleted, keys it set to another object or added are set (new keys in
/// `key_order`, after the others), and nothing else is touched. Kept keys keep their place;
/// when the function `reordered` the keys (a dict kind it sees in its own order), they are then
/// moved into `key_order`. Returns how to undo it.
fn write_mapping_entries<'py>(
    dict: &Bound<'py, PyAny>,
    new: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    key_order: Option<&Bound<'py, PyTuple>>,
    reordered: bool,
    old_keys: &Bound<'py, PyTuple>,
    old: &[Bound<'py, PyAny>],
) -> PyResult<Undo<'py>> {
    let py = dict.py();
    let before: Vec<Bound<'py, PyAny>> = dict.try_iter()?.collect::<PyResult<_>>()?;
    let lookup = PyDict::new(py);
    for (k, v) in &new {
        lookup.set_item(k, v)?;
    }
    let was = PyDict::new(py);
    for (k, v) in old_keys.iter().zip(old) {
        was.set_item(k, v)?;
    }
    let order: Vec<Bound<'py, PyAny>> = match key_order {
        Some(order) => order.iter().collect(),
        None => new.iter().map(|(k, _)| k.clone()).collect(),
    };
    let mut ops = Vec::new();
    let mut apply = || -> PyResult<()> {
        for k in old_keys.iter() {
            if !lookup.contains(&k)? {
                if let Some(value) = raw_get(dict, &k)? {
                    dict.del_item(&k)?;
                    ops.push((k, Some(value)));
                }
            }
        }
        for k in &order {
            let Some(v) = lookup.get_item(k)? else {
                continue;
            };
            if was.get_item(k)?.is_some_and(|o| o.is(&v)) {
                continue;
            }
            let value = raw_get(dict, k)?;
            dict.set_item(k, v)?;
            ops.push((k.clone(), value));
        }
        if reordered {
            put_in_order(dict, &order)?;
        }
        Ok(())
    };
    let result = apply();
    let undo = Undo::MappingEntries(dict.clone(), ops, before);
    match result {
        Ok(()) => Ok(undo),
        Err(e) => {
            undo.run()?;
            Err(e)
        }
    }
}

/// Make a dict (or dict subclass, through its own methods) hold exactly `items`, in order.
fn set_mapping_items<'py>(
    dict: &Bound<'py, PyAny>,
    items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
) -> PyResult<()> {
    dict.call_method0("clear")?;
    for (k, v) in items {
        dict.set_item(k, v)?;
    }
    Ok(())
}

/// A mapping's items, in order.
fn mapping_items<'py>(
    dict: &Bound<'py, PyAny>,
) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    dict.call_method0("items")?
        .try_iter()?
        .map(|item| item?.extract())
        .collect()
}

/// Give the dict (or dict subclass) `dict` the items of `new` in place, as plain Python would
/// leave it: removed keys go and kept keys keep their place, new keys follow in `key_order`
/// (the order the function left, else `new`'s); when the function `reordered` the keys, they
/// end exactly in `key_order` (a key deleted and added back moves to the end). Returns how
/// to undo it.
fn write_mapping<'py>(
    dict: &Bound<'py, PyAny>,
    new: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    key_order: Option<&Bound<'py, PyTuple>>,
    reordered: bool,
) -> PyResult<Undo<'py>> {
    let py = dict.py();
    let old = mapping_items(dict)?;
    let lookup = PyDict::new(py);
    for (k, v) in &new {
        lookup.set_item(k, v)?;
    }
    let order: Vec<Bound<'py, PyAny>> = match key_order {
        Some(order) => order.iter().collect(),
        None => new.iter().map(|(k, _)| k.clone()).collect(),
    };
    let apply = || -> PyResult<()> {
        for (k, _) in &old {
            if !lookup.contains(k)? {
                dict.del_item(k)?;
            }
        }
        for k in &order {
            if let Some(v) = lookup.get_item(k)? {
                dict.set_item(k, v)?;
            }
        }
        if reordered {
            let now: Vec<Bound<'py, PyAny>> = dict.try_iter()?.collect::<PyResult<_>>()?;
            let same = PyList::new(py, now)?
                .as_any()
                .eq(PyList::new(py, &order)?)?;
            if !same {
                dict.call_method0("clear")?;
                for k in &order {
                    if let Some(v) = lookup.get_item(k)? {
                        dict.set_item(k, v)?;
                    }
                }
            }
        }
        Ok(())
    };
    if let Err(e) = apply() {
        set_mapping_items(dict, old)?;
        return Err(e);
    }
    Ok(Undo::Mapping(dict.clone(), old))
}

/// What the writes of one call share: the plan, the undo log (how to undo each step taken,
/// also when a later step fails) and where attributes are stored (`slots.rs`).
struct Writing<'a, 'py> {
    plan: &'a CallPlan,
    done: &'a mut Vec<Undo<'py>>,
    places: &'a mut Vec<SlotPlace>,
}

/// Give `obj` the contents `children` (and the node data of `node`) in place, pushing onto
/// the undo log how to undo each step taken.
fn write_one<'py>(
    obj: &Bound<'py, PyAny>,
    node: &Node,
    origin: &Origin,
    children: &[Bound<'py, PyAny>],
    old: Option<Vec<Bound<'py, PyAny>>>,
    write: &mut Writing<'_, 'py>,
) -> PyResult<()> {
    let done = &mut *write.done;
    let py = obj.py();
    let key_order = origin.key_order.as_ref().map(|o| o.bind(py));
    let old_keys = origin.old_keys.as_ref().map(|k| k.bind(py));
    // The entries to compare with, for a container written entry by entry (rule J20).
    let list_old = old.as_deref();
    let dict_old = old.as_deref().zip(old_keys);
    match &node.kind {
        NodeKind::List => done.push(match list_old {
            Some(old) => write_list_entries(obj, children, old)?,
            None => write_list(obj, PyList::new(py, children)?.as_any())?,
        }),
        NodeKind::Dict(keys) => {
            let new = keys.bind(py).iter().zip(children.iter().cloned()).collect();
            done.push(match dict_old {
                Some((old, old_keys)) => {
                    write_mapping_entries(obj, new, key_order, origin.reordered, old_keys, old)?
                }
                None => write_mapping(obj, new, key_order, origin.reordered)?,
            });
        }
        NodeKind::Custom(..) if origin.direct.is_some() => {
            let direct = origin.direct.as_deref().unwrap_or_default();
            done.push(write_attributes(obj, direct, children, write.places)?);
        }
        NodeKind::Custom(..) => {
            let mut children = children.to_vec();
            let fresh = build_node(py, &node.kind, children.drain(..))?;
            // A registered dict or list subclass (OrderedDict, defaultdict, ...): its items
            // are written as a dict's or a list's, then its attributes as any object's.
            if obj.is_instance_of::<PyDict>() && fresh.is_instance_of::<PyDict>() {
                let new = mapping_items(&fresh)?;
                done.push(match dict_old {
                    Some((old, old_keys)) => {
                        write_mapping_entries(obj, new, key_order, origin.reordered, old_keys, old)?
                    }
                    None => write_mapping(obj, new, key_order, origin.reordered)?,
                });
            } else if obj.is_instance_of::<PyList>() && fresh.is_instance_of::<PyList>() {
                done.push(match list_old {
                    Some(old) => {
                        let new: Vec<_> = fresh.try_iter()?.collect::<PyResult<_>>()?;
                        write_list_entries(obj, &new, old)?
                    }
                    None => write_list(obj, &fresh)?,
                });
            }
            let attrs = origin.attrs.as_ref().map(|a| a.bind(py));
            let undo = write
                .plan
                .write_custom
                .bind(py)
                .call1((obj, fresh, attrs))?;
            done.push(Undo::Call(undo));
        }
        NodeKind::NamedTuple(_) | NodeKind::Tuple | NodeKind::None | NodeKind::Leaf => {
            return Err(PyTypeError::new_err(format!(
                "cannot update a {} in place",
                obj.get_type().name()?
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(d: &Bound<'_, PyAny>) -> Vec<String> {
        d.try_iter()
            .unwrap()
            .map(|k| k.unwrap().to_string())
            .collect()
    }

    /// `{"b": 0, "a": 1}` written with items of `new` (in that order) and `order`.
    fn written(new: &[&str], order: &[&str], reordered: bool) -> (Vec<String>, Vec<String>) {
        Python::attach(|py| {
            let dict = PyDict::new(py);
            dict.set_item("b", 0).unwrap();
            dict.set_item("a", 1).unwrap();
            let dict = dict.into_any();
            let items = new
                .iter()
                .map(|k| {
                    (
                        k.into_pyobject(py).unwrap().into_any(),
                        9i64.into_pyobject(py).unwrap().into_any(),
                    )
                })
                .collect();
            let order = PyTuple::new(py, order).unwrap();
            let undo = write_mapping(&dict, items, Some(&order), reordered).unwrap();
            let after = keys(&dict);
            undo.run().unwrap();
            (after, keys(&dict))
        })
    }

    #[test]
    fn kept_keys_keep_their_place_and_new_keys_follow_the_functions_order() {
        // The function saw the keys sorted (a, b), kept that order and added z then y.
        let (after, undone) = written(&["a", "b", "z", "y"], &["a", "b", "z", "y"], false);
        assert_eq!(after, ["b", "a", "z", "y"]);
        assert_eq!(undone, ["b", "a"]);
    }

    #[test]
    fn a_reordering_function_sets_the_exact_order_and_removed_keys_go() {
        let (after, undone) = written(&["x", "a"], &["x", "a"], true);
        assert_eq!(after, ["x", "a"]);
        assert_eq!(undone, ["b", "a"]);
    }
}
