//! The subtrees of a plan's results that the trace proved to be the caller's own objects,
//! found once when the plan is made: `apply` hands them over without visiting them.

use super::sources::{Origin, Source};
use crate::node::NodeKind;
use crate::sharing::{Entry, SharedTreeDef};
use pyo3::prelude::*;

/// A subtree of the results that is the caller's own object, kept (see `kept_subtrees`).
pub(super) struct Kept {
    /// Its root entry (it starts at the entry whose `skips` names it).
    pub(super) root: usize,
    /// The caller's node it is.
    pub(super) node: usize,
    /// The nodes in it written in place, in entry order: custom nodes whose children are all
    /// leaves, set directly as attributes (an nnx Variable's value).
    pub(super) writes: Vec<usize>,
    /// The entries in it a later `Ref` looks up, each with the caller's node it is.
    pub(super) targets: Vec<(usize, usize)>,
}

/// How many nodes the `kept` subtrees of `def` write, and how many children those have.
pub(super) fn kept_writes(def: &SharedTreeDef, kept: &[Kept]) -> (usize, usize) {
    let writes = kept.iter().flat_map(|k| &k.writes);
    let children = writes.clone().map(|&w| def.entries[w].size() - 1).sum();
    (writes.count(), children)
}

/// By entry of `def`: whether a `Ref` looks it up (empty when none does).
pub(super) fn ref_targets(def: &SharedTreeDef) -> Vec<bool> {
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
pub(super) fn kept_subtrees(
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
