"""Show that reporting N in-place changes of one dict costs O(N), next to jax.jit's trace.

    python benches/mutation_report_scaling.py              # 500, 1000, 2000, 4000 keys
    python benches/mutation_report_scaling.py --sizes 500 1000 --repeats 1

The function replaces every entry of a dict of n scalars and returns nothing. Rows:

- jax.jit: ``jax.jit(f).trace(d)`` (the changes are silently lost);
- clone (warn): ``treeclone.jit(f).trace(d)``, the default policy, whose MutationWarning
  names each of the n discarded changes;
- strict: ``treeclone.jit(f, policy="strict").trace(d)``, whose MutationError names each of
  the n unreturned changes.

Naming each change once rebuilt the dict's whole key list (issue 57: 4,000 keys took 8.8 s
against jax.jit's 0.28 s). Each figure is the median of ``--repeats`` traces of a fresh
function, with the time per key in parentheses: a linear cost shows as a flat column. No
figure is asserted anywhere (tests/policies/test_messages.py checks the report's contents for
a large n instead).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import jax
import numpy as np
import treeclone
from treeclone import MutationError, MutationWarning


def replace_all(d: dict) -> int:
    for k in list(d):
        d[k] = d[k] + 1
    return 0


def state(n: int) -> dict:
    return {f"k{i:06d}": np.float32(i) for i in range(n)}


def trace_jax(n: int) -> None:
    jax.jit(lambda d: replace_all(d)).trace(state(n))


def trace_clone(n: int) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MutationWarning)
        treeclone.jit(lambda d: replace_all(d)).trace(state(n))
    lines = str(caught[-1].message).count(": replaced")
    assert lines == n, (lines, n)


def trace_strict(n: int) -> None:
    try:
        treeclone.jit(lambda d: replace_all(d), policy="strict").trace(state(n))
    except MutationError as e:
        assert str(e).count(": replaced") == n
    else:
        raise AssertionError("strict did not raise")


ROWS: dict[str, Callable[[int], None]] = {
    "jax.jit": trace_jax,
    "clone (warn)": trace_clone,
    "strict": trace_strict,
}


def seconds(run: Callable[[int], None], n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(n)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for run in ROWS.values():  # warm up JAX's own caches
        run(8)
    head = f"{'keys':>6} " + " ".join(f"{name:>24}" for name in ROWS)
    print(head)
    print("-" * len(head))
    for n in args.sizes:
        cells = []
        for run in ROWS.values():
            t = seconds(run, n, args.repeats)
            cells.append(f"{t * 1e3:9.1f} ms ({t / n * 1e6:6.1f} us)")
        print(f"{n:>6} " + " ".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
