//! `jit_partial`'s bound arguments at each call, natively: `bound_join`, the call's leaves and
//! structure made from the bound arguments' (flattened once) and the call's own (flattened
//! now), and `bound_advance`, where the bound leaves are after the call's write-back. Their
//! state is the Python object `treeclone._jit.bound.BoundArguments` (its attributes, read and
//! written here); Python runs only when the bound arguments are flattened again
//! (`BoundArguments.flatten`: the snapshot says they changed, or the call shared or replaced
//! them), so a cached `jit_partial` call runs no Python frame of treeclone's.

use crate::bound::{any_identical, Taker};
use crate::sharing::{flatten_shared, Entry, SharedTreeDef};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyComplex, PyDict, PyFloat, PyInt, PyList, PySet, PySlice, PyString, PyTuple,
};

/// Joined structures kept per bound state (one per structure of the call's own arguments).
const JOIN_CACHE_SIZE: usize = 64;

/// `BoundArguments.lock` (a `threading.RLock`), held until dropped: the snapshot's check runs
/// Python code (a registered flatten, a finalizer), where another thread calling the same
/// `jit_partial` may follow its write-back into the snapshot, and the same thread may call it
/// again; the two take turns.
struct Held<'py>(Bound<'py, PyAny>);

impl<'py> Held<'py> {
    fn lock(bound: &Bound<'py, PyAny>) -> PyResult<Self> {
        let lock = bound.getattr(intern!(bound.py(), "lock"))?;
        lock.call_method0(intern!(bound.py(), "acquire"))?;
        Ok(Held(lock))
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Acquired by this thread above: the release cannot fail.
        let _ = self.0.call_method0(intern!(self.0.py(), "release"));
    }
}

/// `(*items, last)` as a tuple.
fn tuple_with<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    last: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let all: Vec<Bound<'py, PyAny>> = items.chain(std::iter::once(last.clone())).collect();
    PyTuple::new(last.py(), all)
}

/// `flatten_shared(tree)`, as Python sees it.
type Flat<'py> = (Bound<'py, PyList>, Bound<'py, PyAny>, Bound<'py, PyList>);

fn flatten<'py>(tree: &Bound<'py, PyTuple>) -> PyResult<Flat<'py>> {
    let (leaves, def, objects) = flatten_shared(tree)?.into_python(tree.py())?;
    Ok((leaves, def.into_any(), objects))
}

/// A Python scalar: a value, not tracked (a small int is one object everywhere).
fn is_scalar(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_exact_instance_of::<PyInt>()
        || obj.is_exact_instance_of::<PyFloat>()
        || obj.is_exact_instance_of::<PyBool>()
        || obj.is_exact_instance_of::<PyComplex>()
}

/// The value at `key` in the dict `bound.<cache>`, else `make`'s, kept there (the dict emptied
/// first once it holds `limit` entries).
fn kept_in<'py>(
    bound: &Bound<'py, PyAny>,
    cache: &Bound<'py, PyString>,
    key: &Bound<'py, PyAny>,
    limit: usize,
    make: impl FnOnce() -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let cache = bound.getattr(cache)?.cast_into::<PyDict>()?;
    if let Some(found) = cache.get_item(key)? {
        return Ok(found);
    }
    if cache.len() >= limit {
        cache.clear();
    }
    let made = make()?;
    cache.set_item(key, &made)?;
    Ok(made)
}

/// `flatten_shared((*args, kwargs))`, where `args` starts with the bound arguments, flattening
/// only the others (and the bound ones again if they changed since).
#[pyfunction]
pub fn bound_join<'py>(
    bound: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Flat<'py>> {
    let py = bound.py();
    let root = tuple_with(args.iter(), kwargs.as_any())?; // `(*args, kwargs)`
    if bound.getattr(intern!(py, "replaced"))?.is_truthy()? {
        return flatten(&root); // the last call replaced bound containers: flatten all, as jit
    }
    let fresh = {
        let _held = Held::lock(bound)?;
        let snapshot = bound.getattr(intern!(py, "snapshot"))?;
        snapshot.getattr(intern!(py, "checkable"))?.is_truthy()?
            && snapshot
                .call_method0(intern!(py, "unchanged"))?
                .is_truthy()?
    };
    if !fresh {
        bound.call_method0(intern!(py, "flatten"))?;
    }
    let n = bound.getattr(intern!(py, "args"))?.len()?;
    let (leaves, def, objects) = flatten(&tuple_with(args.iter().skip(n), kwargs.as_any())?)?;
    let given: Vec<Bound<'py, PyAny>> = objects.iter().filter(|o| !is_scalar(o)).collect();
    let bound_leaves = bound
        .getattr(intern!(py, "leaves"))?
        .cast_into::<PyList>()?;
    let ids = bound.getattr(intern!(py, "ids"))?.cast_into::<PySet>()?;
    let mut shared = false;
    for obj in &given {
        shared = shared || ids.contains(obj.as_ptr() as usize)?;
    }
    if shared || any_identical(&PyList::new(py, &given)?, &bound_leaves) {
        // An argument reachable from the bound ones: one flatten keeps them one object.
        bound.setattr(intern!(py, "stale"), true)?;
        return flatten(&root);
    }
    let joined = kept_in(bound, intern!(py, "joined"), &def, JOIN_CACHE_SIZE, || {
        let bound_def = bound.getattr(intern!(py, "sdef"))?;
        (py.get_type::<SharedTreeDef>()).call_method1(intern!(py, "join_tuples"), (bound_def, &def))
    })?;
    let all_leaves = PyList::new(py, bound_leaves.iter().chain(leaves.iter()))?;
    let bound_objects = bound
        .getattr(intern!(py, "bound_objects"))?
        .cast_into::<PyList>()?;
    let own_objects = objects.iter().take(objects.len().saturating_sub(1));
    let mut all_objects: Vec<Bound<'py, PyAny>> = bound_objects.iter().chain(own_objects).collect();
    // The bound objects hold None at leaf entries (`BoundArguments.flatten`: they would keep
    // the arrays the write-back replaced alive): the leaves are the bound ones, now.
    let bound_def = bound.getattr(intern!(py, "sdef"))?;
    let bound_def = bound_def.cast::<SharedTreeDef>()?.get();
    for (at, entry) in bound_def.entries.iter().enumerate() {
        if let (Entry::Leaf(slot), Some(place)) = (entry, all_objects.get_mut(at)) {
            *place = bound_leaves.get_item(*slot)?;
        }
    }
    // The arguments the bound state does not hold (`BoundArguments.roots`: weak ones, for
    // `treeclone.jit`'s cache) are this call's, the same objects.
    for root in bound.getattr(intern!(py, "roots"))?.try_iter()? {
        let (at, arg): (usize, usize) = root?.extract()?;
        if let Some(place) = all_objects.get_mut(at) {
            *place = args.get_item(arg)?;
        }
    }
    let all_objects = PyList::new(py, all_objects)?;
    all_objects.append(root)?;
    Ok((all_leaves, joined, all_objects))
}

/// Follow the call's write-back: `next_inputs` (the trace's record) says where the bound
/// leaves are now among `leaves + outputs` and which containers it wrote; False when it
/// replaced bound containers (the next call flattens everything, `bound_join`).
#[pyfunction]
pub fn bound_advance(
    bound: &Bound<'_, PyAny>,
    next_inputs: &Bound<'_, PyAny>,
    leaves: &Bound<'_, PyList>,
    outputs: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let py = bound.py();
    if next_inputs.is(PyBool::new(py, false)) {
        return bound.setattr(intern!(py, "replaced"), true);
    }
    if bound.getattr(intern!(py, "stale"))?.is_truthy()?
        || bound.getattr(intern!(py, "replaced"))?.is_truthy()?
    {
        return bound.call_method0(intern!(py, "flatten")).map(drop);
    }
    if next_inputs.is_none() {
        return Ok(());
    }
    let (index, written): (Bound<'_, PyAny>, Bound<'_, PyAny>) = next_inputs.extract()?;
    let taker = kept_in(bound, intern!(py, "takers"), &index, usize::MAX, || {
        let n = bound.getattr(intern!(py, "leaves"))?.len()?;
        let kept = index.get_item(PySlice::new(py, 0, n as isize, 1))?;
        py.get_type::<Taker>().call1((kept,))
    })?;
    let now = taker.call1((leaves, outputs))?; // the arrays written back (rule J13)
    bound.setattr(intern!(py, "leaves"), &now)?;
    let _held = Held::lock(bound)?;
    (bound.getattr(intern!(py, "snapshot"))?)
        .call_method1(intern!(py, "refresh"), (written, now))?;
    Ok(())
}
