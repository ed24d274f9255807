//! Write-back: `CallPlan.apply` rebuilds a traced function's results and, for `alias`, writes
//! the new contents of the caller's containers back into those very objects, all or nothing
//! (an undo log puts back what was written when a later write fails).

use crate::node::{build_node, Node, NodeKind};
use crate::sharing::{Entry, SharedTreeDef};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

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
                        None => build_node(py, &node.kind, stack.drain(start..))?,
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
                                build_node(py, &node.kind, stack.drain(start..))?
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
        NodeKind::List => {
            let list = obj.cast::<PyList>()?;
            let old = PyList::new(py, list.iter())?;
            list.set_slice(0, list.len(), PyList::new(py, children)?.as_any())?;
            Ok(Undo::List(list.clone(), old))
        }
        NodeKind::Dict(keys) => {
            // As plain Python would leave it: kept keys keep their place, new keys follow.
            let dict = obj.cast::<PyDict>()?;
            let old = dict.copy()?;
            let keys = keys.bind(py);
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
        NodeKind::Custom(..) | NodeKind::NamedTuple(_) => {
            let fresh = build_node(py, &node.kind, children.into_iter())?;
            Ok(Undo::Call(write_custom.call1((obj, fresh))?))
        }
        NodeKind::Tuple | NodeKind::None | NodeKind::Leaf => Err(PyTypeError::new_err(format!(
            "cannot update a {} in place",
            obj.get_type().name()?
        ))),
    }
}
