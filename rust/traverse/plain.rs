//! JAX's flatten: every leaf in order, every container a node.

use super::{walk, Mode, Options};
use crate::keys::address::AddressMap;
use crate::node::{call_custom_flatten, known, Node};
use crate::registry::{classify, Classifier, Kind};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PyTuple};

/// A flattened tree: its leaves (with their key paths when asked for) and its nodes.
#[derive(Default)]
pub struct Flattened<'py> {
    pub leaves: Vec<Bound<'py, PyAny>>,
    pub paths: Vec<Bound<'py, PyTuple>>,
    pub nodes: Vec<Node>,
    with_paths: bool,
}

impl<'py> Mode<'py> for Flattened<'py> {
    #[inline]
    fn leaf(&mut self, obj: Bound<'py, PyAny>, path: &[Py<PyAny>]) -> PyResult<()> {
        if self.with_paths {
            self.paths.push(PyTuple::new(obj.py(), path)?);
        }
        self.nodes.push(Node::leaf());
        self.leaves.push(obj);
        Ok(())
    }

    #[inline]
    fn revisit(&mut self, _: &Bound<'py, PyAny>, _: &Kind) -> bool {
        false
    }

    #[inline]
    fn node(&mut self, _: Bound<'py, PyAny>, node: Node) {
        self.nodes.push(node);
    }

    #[inline]
    fn counts(&self) -> (usize, usize) {
        (self.leaves.len(), self.nodes.len())
    }
}

/// Flatten `tree` as `jax.tree_util.tree_flatten` (with key paths if `opts` asks).
pub fn flatten<'py>(tree: &Bound<'py, PyAny>, opts: &Options<'py>) -> PyResult<Flattened<'py>> {
    let mut out = Flattened {
        with_paths: opts.with_paths,
        ..Flattened::default()
    };
    walk(tree, opts, &mut out)?;
    Ok(out)
}

/// Records nothing: a walk for its checks alone (cycles, and JAX's rules on what flatten
/// functions return).
struct Unrecorded;

impl<'py> Mode<'py> for Unrecorded {
    // JAX's order, as flatten's: a cycle's message names keys by their place in it.

    #[inline]
    fn leaf(&mut self, _: Bound<'py, PyAny>, _: &[Py<PyAny>]) -> PyResult<()> {
        Ok(())
    }

    #[inline]
    fn revisit(&mut self, _: &Bound<'py, PyAny>, _: &Kind) -> bool {
        false
    }

    #[inline]
    fn node(&mut self, _: Bound<'py, PyAny>, _: Node) {}

    #[inline]
    fn counts(&self) -> (usize, usize) {
        (0, 0)
    }
}

/// Raise what `flatten(tree)` would raise on a cycle or a bad flatten result, recording
/// nothing. A tree less than `QUICK_DEPTH` containers deep and without a cycle (all but cyclic
/// or very deep ones) is only looked through (`LookThrough`); the others are walked again as
/// `flatten` walks them, to find and name the cycle.
pub fn check<'py>(tree: &Bound<'py, PyAny>, opts: &Options<'py>) -> PyResult<()> {
    let mut look = LookThrough::new();
    look.push(tree.clone());
    if look.finish()? {
        return Ok(());
    }
    walk(tree, opts, &mut Unrecorded)
}

/// Raise what `check((args, kwargs))` would raise, the static arguments left out as JAX's
/// `jit` and `checkpoint` leave them (hashed, never flattened): a position `i` of `args` that
/// `static_nums` holds as `i` or, counted from the end, as `i - len(args)`, and a keyword that
/// `static_names` holds. The arguments left are looked through together, and walked as one
/// tuple if that look finds something to name.
pub fn check_arguments<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    static_nums: &[isize],
    static_names: &Bound<'py, PyFrozenSet>,
) -> PyResult<()> {
    let kwargs = kwargs.filter(|kwargs| !kwargs.is_empty()); // an empty dict holds no cycle
    if kwargs.is_none() && only_leaves(args, static_nums)? {
        return Ok(()); // the usual call: arrays and scalars hold no cycle
    }
    let statics = (static_nums, static_names);
    let mut look = LookThrough::new();
    for_each_dynamic(args, kwargs, statics, false, |arg| look.push(arg))?;
    if look.finish()? {
        return Ok(());
    }
    // Walked again as one tuple, as flatten walks it, to name what it finds.
    let mut dynamic = Vec::with_capacity(args.len());
    for_each_dynamic(args, kwargs, statics, true, |arg| dynamic.push(arg))?;
    let dynamic = PyTuple::new(args.py(), dynamic)?;
    walk(dynamic.as_any(), &Options::default(), &mut Unrecorded)
}

/// Whether position `i` of `n` arguments is one of `static_nums` (counted from the start, or
/// from the end when negative).
fn is_static(static_nums: &[isize], i: usize, n: usize) -> bool {
    let (i, n) = (i as isize, n as isize);
    static_nums.iter().any(|&num| num == i || num == i - n)
}

/// The positions in a set of `static_argnums` (ints, as `jax.jit` requires them), for
/// `check_arguments`: read once, where the set is given.
pub fn static_positions(static_nums: &Bound<'_, PyFrozenSet>) -> PyResult<Vec<isize>> {
    static_nums
        .iter()
        .map(|num| num.extract::<isize>())
        .collect()
}

/// Hand the arguments that are not static to `take`: the positional ones (`grouped`, as their
/// tuple where none of them is static: the places `check`'s messages name), then the keyword
/// ones (as their dict where none of them is static).
fn for_each_dynamic<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    (static_nums, static_names): (&[isize], &Bound<'py, PyFrozenSet>),
    grouped: bool,
    mut take: impl FnMut(Bound<'py, PyAny>),
) -> PyResult<()> {
    if grouped && static_nums.is_empty() {
        take(args.clone().into_any());
    } else {
        for (i, arg) in args.iter().enumerate() {
            if !is_static(static_nums, i, args.len()) {
                take(arg);
            }
        }
    }
    if let Some(kwargs) = kwargs {
        if static_names.is_empty() {
            take(kwargs.clone().into_any());
            return Ok(());
        }
        // The items are copied out first: a keyword's `__eq__` (a `str` subclass's) runs
        // Python.
        for item in kwargs.items().iter() {
            let (key, value) = item.extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()?;
            if !static_names.contains(key)? {
                take(value);
            }
        }
    }
    Ok(())
}

/// Whether every positional argument that is not static is a leaf (or None).
fn only_leaves(args: &Bound<'_, PyTuple>, static_nums: &[isize]) -> PyResult<bool> {
    for (i, arg) in args.iter().enumerate() {
        if !is_static(static_nums, i, args.len())
            && !matches!(classify(&arg)?, Kind::Leaf | Kind::None)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Depth to which `LookThrough` looks.
const QUICK_DEPTH: usize = 64;

/// A look through trees for whether each is a pytree less than `QUICK_DEPTH` containers deep
/// and without a cycle. Objects wait on one stack with their depth, each held by a strong
/// reference: a flatten function, a classification, or a finalizer run by an allocation may
/// run Python code that changes any container meanwhile. So a list's items are taken one at a
/// time (its length checked at each), and a dict's values and a tuple's items are taken, or
/// passed over as known leaves (`Classifier::known`, which runs no Python code), before any of
/// them is classified further.
///
/// A container met again (shared, as a model's parameters in its optimizer state) is looked
/// into once: what is kept of it is its height, the most containers on a path down from it,
/// which says how deep the tree goes below any other place it is met. A container met again
/// while it is open (an ancestor of the current one) is a cycle.
struct LookThrough<'py> {
    classifier: Classifier<'py>,
    /// Objects to look at, with their depth.
    stack: Vec<(Bound<'py, PyAny>, usize)>,
    /// Every container looked into (held, so that no address here is reused meanwhile), with
    /// its height once it is done (`None` while it is open).
    entered: Vec<(Bound<'py, PyAny>, Option<usize>)>,
    /// Where in `entered` each address is, once there are too many to search one by one.
    index: Option<AddressMap<usize, usize>>,
    /// The open containers (each an ancestor of the next): their place in `entered`, their
    /// height so far, and the stack's length when they were opened (their children are the
    /// entries above it).
    open: Vec<(usize, usize, usize)>,
    /// A custom node's children, on their way to `stack` (one vector for every node).
    children: Vec<Bound<'py, PyAny>>,
}

/// How many entered containers are searched one by one before `LookThrough` indexes them.
const SEARCHED: usize = 32;

/// The largest index `LookThrough` keeps for the next look (in entries).
const KEPT_INDEX: usize = 1 << 16;

thread_local! {
    /// The index of the last look through a large tree, emptied, for the next: a model's
    /// state is looked through at every call, and growing an index (and the list of what was
    /// entered) to its size again was a sixth of the look. Taken while in use, so a look
    /// that runs during another (from a flatten function, or a finalizer) makes its own.
    static SPARE_INDEX: std::cell::Cell<Option<AddressMap<usize, usize>>> =
        const { std::cell::Cell::new(None) };
    /// How many containers the last look entered: the next starts with room for as many.
    static ENTERED_LAST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Drop for LookThrough<'_> {
    fn drop(&mut self) {
        ENTERED_LAST.set(self.entered.len());
        if let Some(mut index) = self.index.take() {
            if index.capacity() <= KEPT_INDEX {
                index.clear(); // addresses only: no Python code runs
                SPARE_INDEX.set(Some(index));
            }
        }
    }
}

impl<'py> LookThrough<'py> {
    fn new() -> Self {
        LookThrough {
            classifier: Classifier::new(),
            stack: Vec::with_capacity(32),
            entered: Vec::with_capacity(ENTERED_LAST.get().clamp(16, KEPT_INDEX)),
            index: None,
            open: Vec::with_capacity(8),
            children: Vec::new(),
        }
    }

    /// Add a tree to look through.
    fn push(&mut self, root: Bound<'py, PyAny>) {
        self.stack.push((root, 0));
    }

    /// Where in `entered` the container at `address` is.
    fn find(&self, address: usize) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(&address).copied(),
            None => self
                .entered
                .iter()
                .position(|(obj, _)| obj.as_ptr() as usize == address),
        }
    }

    /// Look through every tree pushed: false if one is too deep or has a cycle.
    fn finish(&mut self) -> PyResult<bool> {
        loop {
            // Close the containers whose children are all done.
            while let Some(&(at, height, mark)) = self.open.last() {
                if self.stack.len() > mark {
                    break;
                }
                self.open.pop();
                self.entered[at].1 = Some(height);
                self.grow_parent(height);
            }
            let Some((obj, depth)) = self.stack.pop() else {
                return Ok(true);
            };
            let kind = self.classifier.classify(&obj)?;
            if matches!(kind, Kind::Leaf | Kind::None) {
                continue;
            }
            let address = obj.as_ptr() as usize;
            match self.find(address).map(|at| self.entered[at].1) {
                Some(None) => return Ok(false), // an ancestor: a cycle
                Some(Some(height)) if depth + height > QUICK_DEPTH => return Ok(false),
                Some(Some(height)) => {
                    self.grow_parent(height);
                    continue;
                }
                None if depth == QUICK_DEPTH => return Ok(false),
                None => {}
            }
            let at = self.entered.len();
            if let Some(index) = &mut self.index {
                index.insert(address, at);
            } else if at == SEARCHED {
                let mut index = SPARE_INDEX.take().unwrap_or_default();
                index.reserve(2 * SEARCHED);
                for (i, (obj, _)) in self.entered.iter().enumerate() {
                    index.insert(obj.as_ptr() as usize, i);
                }
                index.insert(address, at);
                self.index = Some(index);
            }
            self.open.push((at, 1, self.stack.len()));
            let below = depth + 1;
            match kind {
                Kind::Tuple | Kind::NamedTuple => {
                    // The tuple holds its items while it is held: they can be looked at
                    // before they are taken.
                    for child in obj.cast::<PyTuple>()?.iter_borrowed() {
                        if !is_known_leaf(&self.classifier, child.as_ptr()) {
                            self.stack.push((child.to_owned(), below));
                        }
                    }
                }
                Kind::List => {
                    for child in obj.cast::<PyList>()?.iter() {
                        self.stack.push((child, below));
                    }
                }
                Kind::Dict => {
                    let dict = obj.cast::<PyDict>()?;
                    push_dict_values(dict, &self.classifier, &mut self.stack, below)
                }
                Kind::Custom(custom) => {
                    // Only the children matter here, not their order: for flax nnx's nodes,
                    // without the sorting and aux data of their flatten.
                    let mut children = std::mem::take(&mut self.children);
                    if known::children_into(&obj, &custom, &mut children).is_none() {
                        children = call_custom_flatten(&obj, &custom)?.0;
                    }
                    self.classifier.python_ran();
                    self.stack
                        .extend(children.drain(..).map(|child| (child, below)));
                    self.children = children;
                }
                Kind::Leaf | Kind::None => {}
            }
            self.entered.push((obj, None));
        }
    }

    /// A child of the innermost open container is `height` high.
    fn grow_parent(&mut self, height: usize) {
        if let Some((_, parent, _)) = self.open.last_mut() {
            *parent = (*parent).max(height + 1);
        }
    }
}

/// Push strong references to `dict`'s values, at `depth`, onto `stack`, but for those the
/// classifier already knows as leaves.
fn push_dict_values<'py>(
    dict: &Bound<'py, PyDict>,
    classifier: &Classifier<'py>,
    stack: &mut Vec<(Bound<'py, PyAny>, usize)>,
    depth: usize,
) {
    stack.reserve(dict.len());
    let mut pos: ffi::Py_ssize_t = 0;
    let mut value: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: `dict` is alive (a Bound) and the GIL is held. No Python code runs in this loop
    // (`known` runs none, and a push onto the Vec allocates no Python object), so the dict does
    // not change while iterated, and each borrowed value is looked at, or becomes a strong
    // reference, before the next step.
    unsafe {
        while ffi::PyDict_Next(dict.as_ptr(), &mut pos, std::ptr::null_mut(), &mut value) != 0 {
            if !is_known_leaf(classifier, value) {
                stack.push((Bound::from_borrowed_ptr(dict.py(), value), depth));
            }
        }
    }
}

/// Whether the classifier knows `obj`'s type as a leaf's (or None's).
#[inline(always)]
fn is_known_leaf(classifier: &Classifier<'_>, obj: *mut ffi::PyObject) -> bool {
    // SAFETY: the callers pass a live object, whose type pointer is valid to read.
    let ty = unsafe { ffi::Py_TYPE(obj) };
    matches!(classifier.known(ty), Some(Kind::Leaf | Kind::None))
}
