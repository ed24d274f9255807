//! The one guard every traversal uses against cycles and runaway depth.
//!
//! A container that contains itself makes the path from the root periodic. Each container
//! opened at depth `d` is compared with the one on the path at the largest power of two below
//! `d` (Brent's way): the period is found within a few multiples of (its start + its length)
//! levels, at one pointer comparison per level. A cycle through fresh containers (a custom node
//! whose flatten makes new objects, where only every k-th object on the path repeats) is still
//! caught once the path is `EXACT_DEPTH` deep: from there the guard also keeps the path's
//! addresses in a set. Past `MAX_DEPTH` levels a tree is refused.

use std::collections::HashSet;

/// A tree deeper than this is refused with RecursionError rather than exhausting memory
/// (e.g. a custom node that makes a fresh child node every time it is flattened).
pub const MAX_DEPTH: usize = 1_000_000;

/// From this depth on, the containers on the path are also kept in a set.
const EXACT_DEPTH: usize = 10_000;

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
    /// Addresses of the containers on the path while it is `EXACT_DEPTH` or more deep.
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
        if depth >= EXACT_DEPTH {
            let set = self
                .on_path
                .get_or_insert_with(|| (0..depth).map(&path).collect());
            if !set.insert(address) {
                return Err(Breach::Cycle);
            }
        }
        if depth >= MAX_DEPTH {
            return Err(Breach::TooDeep);
        }
        Ok(())
    }

    /// After closing the container at `address`, which was open at `depth`.
    #[inline]
    pub fn leave(&mut self, address: usize, depth: usize) {
        if depth + 1 >= EXACT_DEPTH {
            // Deep containers leave the set one by one; back above the threshold, it is
            // dropped (and rebuilt from the path if the traversal goes that deep again).
            match self.on_path.as_mut() {
                Some(set) if depth >= EXACT_DEPTH => {
                    set.remove(&address);
                }
                _ => self.on_path = None,
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

    #[test]
    fn too_deep_is_refused() {
        let mut guard = PathGuard::default();
        assert_eq!(guard.enter(1, MAX_DEPTH, |d| d + 10), Err(Breach::TooDeep));
    }
}
