//! Identity-tracking flatten and the write-back unflatten: the primitives of the `alias` and
//! `strict` policies.
//!
//! `flatten_shared` walks a tree like `flatten`, but an object met a second time (by identity)
//! is recorded as a reference to its first occurrence: a shared leaf gets one slot in the leaves
//! list, a shared container becomes a `Ref` node. Dicts keep their insertion order (plain
//! Python's), which is then part of the structure. `SharedTreeDef.unflatten` restores the
//! sharing, so a function traced on the rebuilt tree sees `a is b` where its caller did.
//! `CallPlan.apply` rebuilds a traced function's results and, for `alias`, writes the new
//! contents of the caller's containers back into those very objects, all or nothing.

use crate::flatten::{cycle_error, expand, OpenNode, MAX_DEPTH};
use crate::registry::{self, Kind};
use crate::treedef::{build_node, equality_result, Node};
use pyo3::exceptions::{PyRecursionError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::OnceLock;

/// Hashes an object address: addresses are unique while the objects live, so a multiply-shift
/// of the pointer is a good enough hash and much cheaper than SipHash.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only addresses are hashed")
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = ((n as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type AddressMap<V> = HashMap<usize, V, BuildHasherDefault<AddressHasher>>;

/// One node of a shared treedef, in post-order.
pub enum Entry {
    /// A leaf: index into the unique leaves.
    Leaf(usize),
    /// A container seen earlier in the traversal: index of its first node.
    Ref(usize),
    /// A container met for the first time.
    Node(Node),
}

impl Entry {
    fn arity(&self) -> usize {
        match self {
            Entry::Node(n) => n.arity,
            _ => 0,
        }
    }
}

/// Python scalars are values: CPython shares small ints and interned floats between unrelated
/// places, so their identity says nothing about the caller's intent and is not tracked.
fn is_python_scalar(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: reading the type pointer of a live object.
    let ty = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    ty == &raw mut ffi::PyLong_Type
        || ty == &raw mut ffi::PyFloat_Type
        || ty == &raw mut ffi::PyBool_Type
        || ty == &raw mut ffi::PyComplex_Type
}

enum Seen {
    /// A container still being traversed (meeting it again is a cycle).
    Open,
    /// A finished container: its node index.
    Node(usize),
    /// A leaf: its slot.
    Leaf(usize),
}

pub struct SharedFlat<'py> {
    pub leaves: Vec<Bound<'py, PyAny>>,
    pub entries: Vec<Entry>,
    /// The object at each node: the leaf, the container, or the referenced container.
    pub objects: Vec<Bound<'py, PyAny>>,
}

/// Flatten `tree`, recording shared objects once (see the module comment).
pub fn flatten_shared<'py>(
    tree: &Bound<'py, PyAny>,
    is_leaf: Option<&Bound<'py, PyAny>>,
) -> PyResult<SharedFlat<'py>> {
    let py = tree.py();
    let mut out = SharedFlat {
        leaves: Vec::new(),
        entries: Vec::new(),
        objects: Vec::new(),
    };
    let mut seen: AddressMap<Seen> = AddressMap::default();
    let mut frames: Vec<OpenNode<'py>> = Vec::new();
    let mut pending: Vec<Py<PyAny>> = Vec::new();
    let mut classifier = registry::Classifier::new();
    let mut current = tree.clone();
    loop {
        let forced_leaf = match is_leaf {
            None => false,
            Some(f) => f.call1((&current,))?.is_truthy()?,
        };
        if is_leaf.is_some() {
            classifier.python_ran();
        }
        let kind = if forced_leaf {
            Kind::Leaf
        } else {
            classifier.classify(&current)?
        };
        let address = current.as_ptr() as usize;
        match kind {
            Kind::Leaf => {
                let entry = if is_python_scalar(&current) {
                    out.leaves.push(current.clone());
                    out.leaves.len() - 1
                } else {
                    match seen.get(&address) {
                        Some(Seen::Leaf(slot)) => *slot,
                        _ => {
                            seen.insert(address, Seen::Leaf(out.leaves.len()));
                            out.leaves.push(current.clone());
                            out.leaves.len() - 1
                        }
                    }
                };
                out.entries.push(Entry::Leaf(entry));
                out.objects.push(current);
            }
            Kind::None => {
                out.entries.push(Entry::Node(Node {
                    kind,
                    arity: 0,
                    num_leaves: 0,
                    num_nodes: 1,
                    data: None,
                }));
                out.objects.push(current);
            }
            kind => match seen.get(&address) {
                Some(Seen::Node(first)) => {
                    out.entries.push(Entry::Ref(*first));
                    out.objects.push(current);
                }
                Some(Seen::Open) => {
                    let path: Vec<&OpenNode<'py>> = frames.iter().collect();
                    return Err(cycle_error(py, &path, &current)?);
                }
                _ => {
                    let start = pending.len();
                    let data = if let Kind::Dict = kind {
                        // Insertion order, not JAX's sorted order: code run under these
                        // policies sees dicts as plain Python does, and write-back restores the
                        // order the function leaves.
                        let dict = current.cast::<PyDict>()?;
                        let mut keys = Vec::with_capacity(dict.len());
                        for (k, v) in dict.iter() {
                            keys.push(k);
                            pending.push(v.unbind());
                        }
                        Some(PyTuple::new(py, keys)?.into_any().unbind())
                    } else {
                        if let Kind::Custom(_) = kind {
                            classifier.python_ran();
                        }
                        expand(&current, &kind, &mut pending, None)?
                    };
                    let arity = pending.len() - start;
                    pending[start..].reverse();
                    if frames.len() >= MAX_DEPTH {
                        return Err(PyRecursionError::new_err(format!(
                            "pytree is nested more than {MAX_DEPTH} levels deep"
                        )));
                    }
                    seen.insert(address, Seen::Open);
                    frames.push(OpenNode {
                        obj: current,
                        kind,
                        data,
                        arity,
                        remaining: arity,
                    });
                }
            },
        }
        loop {
            let Some(top) = frames.last_mut() else {
                return Ok(out);
            };
            if top.remaining > 0 {
                top.remaining -= 1;
                current = pending.pop().expect("pending child").into_bound(py);
                break;
            }
            let f = frames.pop().expect("a frame");
            seen.insert(f.obj.as_ptr() as usize, Seen::Node(out.entries.len()));
            out.entries.push(Entry::Node(Node {
                kind: f.kind,
                arity: f.arity,
                num_leaves: 0,
                num_nodes: 0,
                data: f.data,
            }));
            out.objects.push(f.obj);
        }
    }
}

/// The structure of a tree with its sharing: which leaves and containers are the same object.
#[pyclass(frozen, module = "treeclone", name = "SharedTreeDef")]
pub struct SharedTreeDef {
    pub entries: Vec<Entry>,
    pub num_slots: usize,
    /// Whether some container is shared (a `Ref` entry exists).
    has_refs: bool,
    hash: OnceLock<isize>,
}

impl SharedTreeDef {
    fn new(entries: Vec<Entry>, num_slots: usize) -> Self {
        let has_refs = entries.iter().any(|e| matches!(e, Entry::Ref(_)));
        SharedTreeDef {
            entries,
            num_slots,
            has_refs,
            hash: OnceLock::new(),
        }
    }

    /// Indices of node `i`'s children, in order.
    fn child_indices(&self, i: usize) -> PyResult<Vec<usize>> {
        let Some(entry) = self.entries.get(i) else {
            return Err(PyValueError::new_err(format!("no node {i}")));
        };
        // Walk back over whole subtrees: each child's subtree ends right before the next one.
        let mut sizes: Vec<usize> = Vec::with_capacity(i + 1);
        for e in &self.entries[..i] {
            let arity = e.arity();
            let below: usize = sizes.drain(sizes.len() - arity..).sum();
            sizes.push(below + 1);
        }
        let arity = entry.arity();
        let mut children = Vec::with_capacity(arity);
        let mut end = i;
        for size in sizes[sizes.len() - arity..].iter().rev() {
            children.push(end - 1);
            end -= size;
        }
        children.reverse();
        Ok(children)
    }

    /// Rebuild the tree; `objects` receives the object built at each node.
    fn build<'py>(
        &self,
        py: Python<'py>,
        leaves: &[Bound<'py, PyAny>],
        mut objects: Option<&mut Vec<Bound<'py, PyAny>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if leaves.len() != self.num_slots {
            return Err(crate::treedef::leaf_count_error(
                self.num_slots,
                leaves.len(),
            ));
        }
        // Built objects by node index, for `Ref`s and for `objects`.
        let mut built: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.entries.len());
        let mut stack: Vec<Bound<'py, PyAny>> = Vec::with_capacity(16);
        for entry in &self.entries {
            let obj = match entry {
                Entry::Leaf(slot) => leaves[*slot].clone(),
                Entry::Ref(target) => built[*target].clone(),
                Entry::Node(node) => {
                    let start = stack.len() - node.arity;
                    build_node(py, node, stack.drain(start..))?
                }
            };
            stack.push(obj.clone());
            built.push(obj);
        }
        if let Some(objects) = objects.as_mut() {
            objects.extend(built);
        }
        Ok(stack.pop().expect("one root"))
    }

    fn compute_hash(&self, py: Python<'_>) -> PyResult<isize> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.num_slots.hash(&mut h);
        for e in &self.entries {
            match e {
                Entry::Leaf(s) => (0u8, *s).hash(&mut h),
                Entry::Ref(t) => (1u8, *t).hash(&mut h),
                Entry::Node(n) => {
                    2u8.hash(&mut h);
                    n.hash_into(py, &mut h)?;
                }
            }
        }
        Ok(h.finish() as isize)
    }

    fn same(&self, py: Python<'_>, other: &SharedTreeDef) -> PyResult<bool> {
        if self.num_slots != other.num_slots || self.entries.len() != other.entries.len() {
            return Ok(false);
        }
        for (a, b) in self.entries.iter().zip(&other.entries) {
            let equal = match (a, b) {
                (Entry::Leaf(x), Entry::Leaf(y)) | (Entry::Ref(x), Entry::Ref(y)) => x == y,
                (Entry::Node(x), Entry::Node(y)) => x.same_as(py, y)?,
                _ => false,
            };
            if !equal {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[pymethods]
impl SharedTreeDef {
    /// Number of distinct leaves.
    #[getter]
    fn num_leaves(&self) -> usize {
        self.num_slots
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.entries.len()
    }

    /// Rebuild the tree from its distinct leaves, restoring the sharing.
    fn unflatten<'py>(
        &self,
        py: Python<'py>,
        leaves: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.build(py, &leaves, None)
    }

    /// `(tree, objects)`: the rebuilt tree and the object built at each node.
    fn unflatten_nodes<'py>(
        &self,
        py: Python<'py>,
        leaves: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
        let mut objects = Vec::with_capacity(self.entries.len());
        let root = self.build(py, &leaves, Some(&mut objects))?;
        Ok((root, PyList::new(py, objects)?))
    }

    /// One tuple per node: `("leaf", slot)`, `("ref", node)` or `("node", type, arity, data)`.
    fn node_info<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.entries
            .iter()
            .map(|e| match e {
                Entry::Leaf(s) => ("leaf", *s).into_pyobject(py),
                Entry::Ref(t) => ("ref", *t).into_pyobject(py),
                Entry::Node(n) => (
                    "node",
                    n.node_type(py),
                    n.arity,
                    n.data.as_ref().map(|d| d.bind(py)),
                )
                    .into_pyobject(py),
            })
            .collect()
    }

    /// Node indices of node `i`'s children.
    fn children_of(&self, i: usize) -> PyResult<Vec<usize>> {
        self.child_indices(i)
    }

    /// For each child of node `i`: the sorted leaf slots in its subtree (references followed).
    fn child_slots(&self, i: usize) -> PyResult<Vec<Vec<usize>>> {
        self.child_indices(i)?
            .into_iter()
            .map(|c| {
                let mut slots = self.slots_under(c)?;
                slots.sort_unstable();
                slots.dedup();
                Ok(slots)
            })
            .collect()
    }

    fn __richcmp__(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        op: CompareOp,
    ) -> PyResult<Py<PyAny>> {
        let Ok(other) = other.cast::<SharedTreeDef>() else {
            return Ok(py.NotImplemented());
        };
        equality_result(py, self.same(py, other.get())?, op)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        if let Some(h) = self.hash.get() {
            return Ok(*h);
        }
        let h = self.compute_hash(py)?;
        Ok(*self.hash.get_or_init(|| h))
    }

    fn __repr__(&self) -> String {
        let refs = self
            .entries
            .iter()
            .filter(|e| matches!(e, Entry::Ref(_)))
            .count();
        let leaves = self
            .entries
            .iter()
            .filter(|e| matches!(e, Entry::Leaf(_)))
            .count();
        format!(
            "SharedTreeDef({} nodes, {} leaves of which {} distinct, {} shared containers)",
            self.entries.len(),
            leaves,
            self.num_slots,
            refs
        )
    }
}

impl SharedTreeDef {
    /// Slots of the leaves under node `i` (following references).
    fn slots_under(&self, i: usize) -> PyResult<Vec<usize>> {
        let mut out = Vec::new();
        let mut agenda = vec![i];
        while let Some(n) = agenda.pop() {
            match &self.entries[n] {
                Entry::Leaf(s) => out.push(*s),
                Entry::Ref(t) => agenda.push(*t),
                Entry::Node(_) => agenda.extend(self.child_indices(n)?),
            }
        }
        Ok(out)
    }
}

/// `(leaves, shared_treedef, objects)`: the distinct leaves, the structure with its sharing,
/// and the object at each node.
#[pyfunction(name = "flatten_shared")]
#[pyo3(signature = (tree, is_leaf=None))]
pub fn py_flatten_shared<'py>(
    tree: &Bound<'py, PyAny>,
    is_leaf: Option<Bound<'py, PyAny>>,
) -> PyResult<(
    Bound<'py, PyList>,
    Bound<'py, SharedTreeDef>,
    Bound<'py, PyList>,
)> {
    let py = tree.py();
    let is_leaf = is_leaf.filter(|f| !f.is_none());
    let flat = flatten_shared(tree, is_leaf.as_ref())?;
    let num_slots = flat.leaves.len();
    Ok((
        PyList::new(py, flat.leaves)?,
        Bound::new(py, SharedTreeDef::new(flat.entries, num_slots))?,
        PyList::new(py, flat.objects)?,
    ))
}

/// Where a result leaf comes from.
enum Source {
    /// The caller's input leaf in this slot (unchanged by the function: not materialized).
    Input(usize),
    /// The computation's output at this index.
    Output(usize),
}

/// `(input_node, old_child_nodes, same_data, writable, key_order)`, as Python gives an
/// `Origin`.
type OriginTuple = (usize, Vec<usize>, bool, bool, Option<Py<PyTuple>>);

/// A pending in-place write: the caller's object, its node, its origin, its new children.
type Write<'a, 'py> = (
    Bound<'py, PyAny>,
    &'a Node,
    &'a Origin,
    Vec<Bound<'py, PyAny>>,
);

/// How a node of the results relates to the caller's tree (for write-back).
struct Origin {
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
}

/// What a traced call returns and writes, fixed at trace time, applied at every call.
#[pyclass(frozen, module = "treeclone")]
pub struct CallPlan {
    def: Py<SharedTreeDef>,
    sources: Vec<Source>,
    /// Per node: the caller's container it is (written back in place), or None (built fresh).
    /// Only `alias` plans have any.
    origins: Vec<Option<Origin>>,
    /// Index of the root's child to return (the results part of `(inputs, results)`); None
    /// to return the root itself.
    result_child: Option<usize>,
    /// `write_custom(obj, new_obj) -> undo` for custom nodes, from Python.
    write_custom: Py<PyAny>,
}

#[pymethods]
impl CallPlan {
    /// `sources`: per leaf slot of `def`, `(0, input_slot)` or `(1, output_index)`.
    /// `origins`: per node of `def`, None or
    /// `(input_node, old_child_nodes, same_data, writable, key_order)`.
    #[new]
    #[pyo3(signature = (def, sources, origins, result_child, write_custom))]
    fn new(
        def: Py<SharedTreeDef>,
        sources: Vec<(u8, usize)>,
        origins: Vec<Option<OriginTuple>>,
        result_child: Option<usize>,
        write_custom: Py<PyAny>,
    ) -> PyResult<Self> {
        let sources = sources
            .into_iter()
            .map(|(code, v)| {
                Ok(match code {
                    0 => Source::Input(v),
                    1 => Source::Output(v),
                    _ => return Err(PyValueError::new_err("bad source code")),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let origins = origins
            .into_iter()
            .map(|o| {
                o.map(
                    |(node, old_children, same_data, writable, key_order)| Origin {
                        node,
                        old_children,
                        same_data,
                        writable,
                        key_order,
                    },
                )
            })
            .collect();
        Ok(CallPlan {
            def,
            sources,
            origins,
            result_child,
            write_custom,
        })
    }

    /// Build the results from the caller's `input_leaves` / `input_objects` (from
    /// `flatten_shared` of the call's arguments) and the computation's `outputs`, writing back
    /// into the caller's containers where the plan has origins. All writes happen or none does.
    fn apply<'py>(
        &self,
        py: Python<'py>,
        input_leaves: &Bound<'py, PyList>,
        input_objects: &Bound<'py, PyList>,
        outputs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let def = self.def.get();
        if self.sources.len() != def.num_slots || self.origins.len() != def.entries.len() {
            return Err(PyValueError::new_err("inconsistent call plan"));
        }
        // jax hands the outputs over as a list or a tuple.
        let outputs = match outputs.cast::<PyList>() {
            Ok(list) => list.to_tuple(),
            Err(_) => outputs.cast::<PyTuple>().cloned().map_err(|_| {
                PyTypeError::new_err("the computation's outputs must come as a list or tuple")
            })?,
        };
        let mut leaves: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.sources.len());
        for s in &self.sources {
            leaves.push(match s {
                Source::Input(i) => input_leaves.get_item(*i)?,
                Source::Output(i) => outputs.get_item(*i)?,
            });
        }
        let mut writes: Vec<Write<'_, 'py>> = Vec::new();
        // Objects by node index, kept only when a `Ref` will look one up.
        let mut built: Vec<Bound<'py, PyAny>> = Vec::new();
        if def.has_refs {
            built.reserve(def.entries.len());
        }
        let mut stack: Vec<Bound<'py, PyAny>> = Vec::with_capacity(16);
        for (entry, origin) in def.entries.iter().zip(&self.origins) {
            let obj = match entry {
                Entry::Leaf(slot) => leaves[*slot].clone(),
                Entry::Ref(target) => built[*target].clone(),
                Entry::Node(node) => {
                    let start = stack.len() - node.arity;
                    match origin {
                        None => build_node(py, node, stack.drain(start..))?,
                        Some(o) => {
                            let original = input_objects.get_item(o.node)?;
                            let mut unchanged = o.same_data && o.old_children.len() == node.arity;
                            if unchanged {
                                for (new, &old) in stack[start..].iter().zip(&o.old_children) {
                                    if !new.is(input_objects.get_item(old)?) {
                                        unchanged = false;
                                        break;
                                    }
                                }
                            }
                            if unchanged {
                                stack.truncate(start);
                                original
                            } else if o.writable {
                                writes.push((
                                    original.clone(),
                                    node,
                                    o,
                                    stack.drain(start..).collect(),
                                ));
                                original
                            } else {
                                build_node(py, node, stack.drain(start..))?
                            }
                        }
                    }
                }
            };
            if def.has_refs {
                built.push(obj.clone());
            }
            stack.push(obj);
        }
        let root = stack.pop().expect("one root");
        self.write_all(py, writes)?;
        match self.result_child {
            None => Ok(root),
            Some(i) => root.get_item(i),
        }
    }
}

/// How to put a container back as it was.
enum Undo<'py> {
    List(Bound<'py, PyList>, Bound<'py, PyList>),
    Dict(Bound<'py, PyDict>, Bound<'py, PyDict>),
    Call(Bound<'py, PyAny>),
}

impl CallPlan {
    fn write_all<'py>(&self, py: Python<'py>, writes: Vec<Write<'_, 'py>>) -> PyResult<()> {
        let mut done: Vec<Undo<'py>> = Vec::with_capacity(writes.len());
        for (obj, node, origin, children) in writes {
            let order = origin.key_order.as_ref().map(|o| o.bind(py));
            match write_one(py, &obj, node, order, children, self.write_custom.bind(py)) {
                Ok(undo) => done.push(undo),
                Err(err) => {
                    // Put back what was written, newest first; the first error is the one
                    // reported, so a failing undo is only attached as context.
                    for undo in done.into_iter().rev() {
                        let restored = match undo {
                            Undo::List(l, old) => l.set_slice(0, l.len(), old.as_any()),
                            Undo::Dict(d, old) => {
                                d.clear();
                                d.update(old.as_mapping())
                            }
                            Undo::Call(f) => f.call0().map(|_| ()),
                        };
                        if let Err(e) = restored {
                            err.set_cause(py, Some(e));
                        }
                    }
                    return Err(err);
                }
            }
        }
        Ok(())
    }
}

/// Give `obj` the contents `children` (and the node data of `node`) in place.
fn write_one<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    node: &Node,
    key_order: Option<&Bound<'py, PyTuple>>,
    children: Vec<Bound<'py, PyAny>>,
    write_custom: &Bound<'py, PyAny>,
) -> PyResult<Undo<'py>> {
    match &node.kind {
        Kind::List => {
            let list = obj.cast::<PyList>()?;
            let old = PyList::new(py, list.iter())?;
            list.set_slice(0, list.len(), PyList::new(py, children)?.as_any())?;
            Ok(Undo::List(list.clone(), old))
        }
        Kind::Dict => {
            // As plain Python would leave it: kept keys keep their place, new keys follow.
            let dict = obj.cast::<PyDict>()?;
            let old = dict.copy()?;
            let keys = node.data.as_ref().expect("dict keys").bind(py);
            let keys = keys.cast::<PyTuple>()?;
            let new = PyDict::new(py);
            for (k, v) in keys.iter().zip(children) {
                new.set_item(k, v)?;
            }
            let apply = || -> PyResult<()> {
                for k in dict.keys() {
                    if !new.contains(&k)? {
                        dict.del_item(&k)?;
                    }
                }
                // The order the function left its dict in (a key deleted and added back moves
                // to the end, as in plain Python); without one, kept keys keep their place and
                // new keys follow sorted.
                match key_order {
                    Some(order) => {
                        for k in order.iter() {
                            if let Some(v) = new.get_item(&k)? {
                                dict.set_item(k, v)?;
                            }
                        }
                        if !dict.keys().as_any().eq(order.to_list())? {
                            dict.clear();
                            for k in order.iter() {
                                if let Some(v) = new.get_item(&k)? {
                                    dict.set_item(k, v)?;
                                }
                            }
                        }
                    }
                    None => {
                        for (k, v) in new.iter() {
                            dict.set_item(k, v)?;
                        }
                    }
                }
                Ok(())
            };
            if let Err(e) = apply() {
                dict.clear();
                dict.update(old.as_mapping())?;
                return Err(e);
            }
            Ok(Undo::Dict(dict.clone(), old))
        }
        Kind::Custom(_) | Kind::NamedTuple => {
            let mut children = children;
            let fresh = build_node(py, node, children.drain(..))?;
            Ok(Undo::Call(write_custom.call1((obj, fresh))?))
        }
        Kind::Tuple | Kind::None | Kind::Leaf => Err(PyTypeError::new_err(format!(
            "cannot update a {} in place",
            obj.get_type().name()?
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(arity: usize) -> Entry {
        Entry::Node(Node {
            kind: Kind::List,
            arity,
            num_leaves: 0,
            num_nodes: 0,
            data: None,
        })
    }

    /// `[[a, b], <ref to [a, b]>, a]`: post-order a, b, [a, b], ref, a, root.
    fn sample() -> SharedTreeDef {
        SharedTreeDef::new(
            vec![
                Entry::Leaf(0),
                Entry::Leaf(1),
                list(2),
                Entry::Ref(2),
                Entry::Leaf(0),
                list(3),
            ],
            2,
        )
    }

    #[test]
    fn children_skip_whole_subtrees() {
        let def = sample();
        assert_eq!(def.child_indices(5).unwrap(), vec![2, 3, 4]);
        assert_eq!(def.child_indices(2).unwrap(), vec![0, 1]);
        assert!(def.child_indices(0).unwrap().is_empty());
        assert!(def.child_indices(6).is_err());
    }

    #[test]
    fn slots_follow_references() {
        let def = sample();
        let mut under_ref = def.slots_under(3).unwrap();
        under_ref.sort_unstable();
        assert_eq!(under_ref, vec![0, 1]);
        assert_eq!(
            def.child_slots(5).unwrap(),
            vec![vec![0, 1], vec![0, 1], vec![0]]
        );
    }

    #[test]
    fn address_hash_spreads_aligned_pointers() {
        let hash = |n: usize| {
            let mut h = AddressHasher::default();
            h.write_usize(n);
            h.finish()
        };
        let hashes: std::collections::HashSet<u64> = (0..1000)
            .map(|i| hash(0x7f00_0000 + 16 * i) >> 54)
            .collect();
        assert!(
            hashes.len() > 500,
            "top bits too clustered: {}",
            hashes.len()
        );
    }
}
