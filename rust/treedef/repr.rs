//! JAX's text form of a treedef: `PyTreeDef({'a': *, 'b': [*, None]})`.

use super::PyTreeDef;
use crate::node::NodeKind;
use pyo3::prelude::*;

fn type_name(ty: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(ty.getattr("__name__")?.str()?.to_string())
}

impl PyTreeDef {
    /// Pre-order over an explicit stack, writing into one string: linear at any depth.
    pub(super) fn repr(&self, py: Python<'_>) -> PyResult<String> {
        enum Item {
            Node(usize),
            Text(String),
        }
        let mut out = String::from("PyTreeDef(");
        let mut work = vec![Item::Node(self.nodes.len() - 1)];
        while let Some(item) = work.pop() {
            let i = match item {
                Item::Text(t) => {
                    out.push_str(&t);
                    continue;
                }
                Item::Node(i) => i,
            };
            let node = &self.nodes[i];
            let (open, close) = match &node.kind {
                NodeKind::Leaf => ("*".to_string(), ""),
                NodeKind::None => ("None".to_string(), ""),
                NodeKind::Tuple if node.arity == 1 => ("(".to_string(), ",)"),
                NodeKind::Tuple => ("(".to_string(), ")"),
                NodeKind::List => ("[".to_string(), "]"),
                NodeKind::Dict(_) => ("{".to_string(), "}"),
                NodeKind::NamedTuple(ty) => (
                    format!("CustomNode(namedtuple[{}], [", type_name(ty.bind(py))?),
                    "])",
                ),
                NodeKind::Custom(c, aux) => (
                    format!(
                        "CustomNode({}[{}], [",
                        type_name(c.ty.bind(py))?,
                        aux.bind(py).str()?
                    ),
                    "])",
                ),
            };
            out.push_str(&open);
            work.push(Item::Text(close.to_string()));
            let keys = match &node.kind {
                NodeKind::Dict(keys) => Some(keys.bind(py)),
                _ => None,
            };
            // Pushed in reverse so they pop in order.
            for (k, &child) in self.child_indices(i).iter().enumerate().rev() {
                work.push(Item::Node(child));
                if let Some(keys) = keys {
                    work.push(Item::Text(format!("{}: ", keys.get_item(k)?.repr()?)));
                }
                if k > 0 {
                    work.push(Item::Text(", ".to_string()));
                }
            }
        }
        out.push(')');
        Ok(out)
    }
}
