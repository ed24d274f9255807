"""Show that the cycle/depth guard has no cliff at its exact-depth threshold.

    python benches/depth_guard_scaling.py
    python benches/depth_guard_scaling.py --depths 9000 9999 --branches 1000 --repeats 1

A list nested ``depth`` levels deep (a spine) with ``--branches`` small lists at its bottom,
each holding one more list. The guard keeps the path's addresses in a set from 10,000 levels
on (rust/traverse/guard.rs); it used to drop that set each time the path went back above the
threshold, so with the branches just there each branch rebuilt it: issue 57 measured 763 ms
at 9,998 levels against 2.5 ms at 9,000. Rows: ``treeclone.tree_util.tree_flatten`` (JAX's
flatten) and the identity-tracking flatten of the alias and strict policies. Each figure is
the median of ``--repeats`` runs; the figure in parentheses divides by the number of
containers, so a flat column is a linear cost, with no step at the threshold. No figure is
asserted anywhere (the guard's own tests count its work).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import treeclone.tree_util as tu
from treeclone import _native


def spine(depth: int, branches: int) -> list:
    root: list = []
    cur = root
    for _ in range(depth - 1):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    cur.extend([[i]] for i in range(branches))
    return root


ROWS: dict[str, Callable[[list], object]] = {
    "tree_flatten": tu.tree_flatten,
    "flatten_shared (alias)": _native.flatten_shared,
}


def seconds(run: Callable[[list], object], tree: list, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(tree)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--depths",
        type=int,
        nargs="+",
        default=[5000, 9000, 9997, 9998, 9999, 10000, 10001, 12000, 20000],
    )
    parser.add_argument("--branches", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    head = f"{'depth':>6} " + " ".join(f"{name:>26}" for name in ROWS)
    print(f"{args.branches} branches at the bottom of each spine")
    print(head)
    print("-" * len(head))
    for depth in args.depths:
        tree = spine(depth, args.branches)
        containers = depth + 2 * args.branches
        cells = []
        for run in ROWS.values():
            t = seconds(run, tree, args.repeats)
            cells.append(f"{t * 1e3:9.2f} ms ({t / containers * 1e9:6.0f} ns)")
        print(f"{depth:>6} " + " ".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
