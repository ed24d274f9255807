//! The one guard every traversal uses against cycles and runaway depth.
//!
//! A container that contains itself makes the path from the root periodic. Each container
//! opened at depth `d` is compared with the one on the path at the largest power of two below
//! `d` (Brent's way): the period is found within a few multiples of (its start + its length)
//! levels, at one pointer comparison per level. A cycle through fresh containers (a custom node
//! whose flatten makes new objects, where only every k-th object on the path repeats) is still
//! caught once the path is `EXACT_DEPTH` deep: from there the guard also keeps the path's
//! addresses in a set. Past `MAX_DEPTH` levels a tree is refused.
//!
//! The set is built from the path once, when the path first reaches `EXACT_DEPTH`, and from
//! then on kept equal to the path (each container opened goes in, each closed comes out) until
//! the path is back to `EXACT_DEPTH / 2` levels. Dropping it as soon as the path went back
//! above the threshold made a rebuild (`EXACT_DEPTH` addresses) of every container just past
//! it: many small branches at the bottom of a spine of `EXACT_DEPTH - 1` levels cost
//! O(branches x depth) (issue 57: 763 ms, against 2.5 ms 1,000 levels higher). With the margin,
//! each rebuild follows at least `EXACT_DEPTH / 2` containers opened since the last drop, so
//! the set costs O(1) per container, amortized.

use std::collections::HashSet;

/// A tree deeper than this is refused with RecursionError rather than exhausting memory
/// (e.g. a custom node that makes a fresh child node every time it is flattened).
pub const MAX_DEPTH: usize = 1_000_000;

/// From this depth on, the containers on the path are also kept in a set.
const EXACT_DEPTH: usize = 10_000;

/// The set, once built, is kept while the path is deeper than this.
const DROP_DEPTH: usize = EXACT_DEPTH / 2;

/// Why a container may not be opened.
#[derive(Debug, PartialEq, Eq)]
pub enum Breach {
    /// It is already open on the path.
    Cycle,
    /// The path is `MAX_DEPTH` deep.
    TooDeep,
}

/// Guards one traversal's path; the traversal reports each container it opens and closes, by
/// address, with the addresses of the containers open above it (root first).
#[derive(Default)]
pub struct PathGuard {
    /// Addresses of all the containers on the path, from when it first reached `EXACT_DEPTH`
    /// levels until it is back to `DROP_DEPTH`.
    on_path: Option<HashSet<usize>>,
}

impl PathGuard {
    /// Before opening the container at `address` below the open ones, `path(d)` being the
    /// address of the one at depth `d` (`depth` of them are open).
    #[inline]
    pub fn enter(
        &mut self,
        address: usize,
        depth: usize,
        path: impl Fn(usize) -> usize,
    ) -> Result<(), Breach> {
        if let Some(anchor) = anchor(depth) {
            if path(anchor) == address {
                return Err(Breach::Cycle);
            }
        }
        if depth >= MAX_DEPTH {
            return Err(Breach::TooDeep);
        }
        if self.on_path.is_none() && depth >= EXACT_DEPTH {
            self.on_path = Some((0..depth).map(&path).collect());
        }
        if let Some(set) = self.on_path.as_mut() {
            if !set.insert(address) {
                return Err(Breach::Cycle);
            }
        }
        Ok(())
    }

    /// After closing the container at `address`, which was open at `depth`.
    #[inline]
    pub fn leave(&mut self, address: usize, depth: usize) {
        if let Some(set) = self.on_path.as_mut() {
            if depth <= DROP_DEPTH {
                // Far enough above the threshold: rebuilt from the path if it comes back.
                self.on_path = None;
            } else {
                set.remove(&address);
            }
        }
    }
}

/// The depth of the container a new container at `depth` is compared with: the largest power
/// of two below `depth` (None when `depth` is itself a power of two, or 0).
fn anchor(depth: usize) -> Option<usize> {
    if depth == 0 || depth.is_power_of_two() {
        return None;
    }
    Some(1usize << (usize::BITS - 1 - depth.leading_zeros()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn anchor_is_the_previous_power_of_two() {
        assert_eq!(anchor(0), None);
        assert_eq!(anchor(1), None);
        assert_eq!(anchor(2), None);
        assert_eq!(anchor(3), Some(2));
        assert_eq!(anchor(5), Some(4));
        assert_eq!(anchor(7), Some(4));
        assert_eq!(anchor(8), None);
        assert_eq!(anchor(1000), Some(512));
    }

    /// Simulate a path that enters a cycle of length `period` at depth `start`: the guard
    /// must meet a repeated container within a bounded number of levels.
    #[test]
    fn every_periodic_path_is_caught() {
        for start in 0..70 {
            for period in 1..70 {
                let at = |d: usize| {
                    if d < start {
                        1000 + d
                    } else {
                        (d - start) % period
                    }
                };
                let mut guard = PathGuard::default();
                let found = (0..10_000).find(|&d| guard.enter(at(d), d, at).is_err());
                let d = found.expect("cycle detected");
                assert!(
                    d <= 4 * (start + period) + 4,
                    "start {start} period {period}: {d}"
                );
            }
        }
    }

    /// A cycle whose containers are fresh objects except every `k`-th is caught by the exact
    /// set once the path is deep enough.
    #[test]
    fn sparse_repeats_are_caught_past_the_exact_depth() {
        let at = |d: usize| {
            if d.is_multiple_of(3) {
                7
            } else {
                1_000_000 + d
            }
        };
        let mut guard = PathGuard::default();
        let found = (0..EXACT_DEPTH + 10).find(|&d| guard.enter(at(d), d, at).is_err());
        assert!(found.is_some_and(|d| d <= EXACT_DEPTH + 3));
    }

    /// A path that goes down to the threshold and back up a little, again and again (small
    /// branches at the bottom of a long spine), builds the set once, not once per branch
    /// (`reads` counts the path's addresses read: one per container for its anchor, and
    /// `EXACT_DEPTH` for a build); once back at `DROP_DEPTH`, the set is let go and built again
    /// if the path goes that deep again.
    #[test]
    fn branches_near_the_threshold_build_the_set_once() {
        let address = |d: usize| 1_000_000 + d;
        let reads = Cell::new(0usize);
        let spine = |d: usize| {
            reads.set(reads.get() + 1);
            address(d)
        };
        let mut guard = PathGuard::default();
        for d in 0..EXACT_DEPTH - 1 {
            guard.enter(address(d), d, spine).unwrap();
        }
        let before = reads.get();
        for branch in 0..100 {
            // A branch at depth EXACT_DEPTH - 1 holding a container at EXACT_DEPTH.
            let (outer, inner) = (10 * branch, 10 * branch + 1);
            let at = |d: usize| if d < EXACT_DEPTH - 1 { spine(d) } else { outer };
            guard.enter(outer, EXACT_DEPTH - 1, at).unwrap();
            guard.enter(inner, EXACT_DEPTH, at).unwrap();
            guard.leave(inner, EXACT_DEPTH);
            guard.leave(outer, EXACT_DEPTH - 1);
        }
        let reads_since = |before: usize| reads.get() - before;
        assert!(
            reads_since(before) <= EXACT_DEPTH + 200,
            "{}",
            reads_since(before)
        );
        // Up to just below DROP_DEPTH and down again: the set is kept.
        for d in (DROP_DEPTH + 1..EXACT_DEPTH - 1).rev() {
            guard.leave(address(d), d);
        }
        let before = reads.get();
        for d in DROP_DEPTH + 1..=EXACT_DEPTH {
            guard.enter(address(d), d, spine).unwrap();
        }
        assert!(reads_since(before) <= EXACT_DEPTH - DROP_DEPTH);
        // Up to DROP_DEPTH: let go, built again at EXACT_DEPTH.
        for d in (DROP_DEPTH..=EXACT_DEPTH).rev() {
            guard.leave(address(d), d);
        }
        let before = reads.get();
        for d in DROP_DEPTH..=EXACT_DEPTH {
            guard.enter(address(d), d, spine).unwrap();
        }
        assert!(reads_since(before) >= EXACT_DEPTH);
    }

    /// While the set is held above the threshold, a container already on the path is a cycle
    /// there too (it is the path's exact set), and one closed is not.
    #[test]
    fn the_held_set_is_the_path() {
        let at = |d: usize| 5_000_000 + d;
        let mut guard = PathGuard::default();
        for d in 0..=EXACT_DEPTH {
            guard.enter(at(d), d, at).unwrap();
        }
        for d in (DROP_DEPTH + 10..=EXACT_DEPTH).rev() {
            guard.leave(at(d), d);
        }
        let depth = DROP_DEPTH + 10;
        assert_eq!(guard.enter(at(7), depth, at), Err(Breach::Cycle));
        assert_eq!(guard.enter(at(depth + 1), depth, at), Ok(()));
    }

    #[test]
    fn too_deep_is_refused() {
        let mut guard = PathGuard::default();
        assert_eq!(guard.enter(1, MAX_DEPTH, |d| d + 10), Err(Breach::TooDeep));
    }
}
