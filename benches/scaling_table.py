"""Show that treeclone's costs grow linearly with the tree, next to jax.jit, and write the table.

    python benches/scaling_table.py               # full run, rewrites the table in the docs
    python benches/scaling_table.py --quick --out /tmp/scaling.md

Wide nodes (a list and a dict of n children, each an empty dict or an array: wide nodes made
tracing quadratic twice, through per-child reads of a node's children and of a dict's keys)
and a list nested n deep. Rows:

- trace: the first call of a freshly jitted identity function (flatten, trace, compile,
  write-back plan), under jax.jit and treeclone's alias and strict; the array rows stop at
  10,000 children, where jax.jit's own first call already takes seconds (XLA compiles one
  output per array);
- call: ``treeclone.call`` (eager, no jit) under alias and strict;
- donated call: a cached call with ``donate_argnums=0`` on n one-element arrays in dicts, per
  call (jax.jit against treeclone alias).

Each figure is the median of ``--repeats`` runs (a fresh function each time where tracing is
measured); the figure in parentheses divides by n, so a linear cost shows as a flat column.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import treeclone
import treeclone.tree_util as tu
from tree_table import DEFAULT_OUT, INTRO
from treeclone.bench.timing import machine_info, script_command, write_section

BEGIN = "<!-- scaling-table:begin -->"
END = "<!-- scaling-table:end -->"


def empty_dicts(n: int) -> list:
    return [{} for _ in range(n)]


def dict_of_empty_dicts(n: int) -> dict:
    return {f"k{i:06d}": {} for i in range(n)}


def list_of_arrays(n: int) -> list:
    return [jnp.full((), i, jnp.float32) for i in range(n)]


def dict_of_arrays(n: int) -> dict:
    return {f"k{i:06d}": jnp.full((), i, jnp.float32) for i in range(n)}


def deep_list(n: int) -> list:
    tree: list = []
    for _ in range(n):
        tree = [tree]
    return tree


def arrays_in_dicts(n: int) -> list:
    return [{"w": jnp.zeros(1)} for _ in range(n)]


def seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def trace_row(
    make: Callable[[int], object], n: int, repeats: int, with_jax: bool = True
) -> dict[str, float]:
    tree = make(n)

    def first_call(jit: Callable) -> Callable[[], object]:
        # Blocked on through treeclone's leaves: JAX's own flatten recurses natively.
        return lambda: jax.block_until_ready(tu.tree_leaves(jit(lambda t: t)(tree)))

    jax_cell = {"jax.jit": seconds(first_call(jax.jit), repeats)} if with_jax else {}
    return {
        **jax_cell,
        "alias": seconds(first_call(lambda f: treeclone.jit(f, policy="alias")), repeats),
        "strict": seconds(first_call(lambda f: treeclone.jit(f, policy="strict")), repeats),
        "call alias": seconds(lambda: treeclone.call(lambda t: t, tree, policy="alias"), repeats),
        "call strict": seconds(lambda: treeclone.call(lambda t: t, tree, policy="strict"), repeats),
    }


def donation_row(n: int, repeats: int) -> dict[str, float]:
    def step(t):
        return [{"w": d["w"] + 1} for d in t]

    out = {}
    for name, jit in (
        ("jax.jit", lambda: jax.jit(step, donate_argnums=0)),
        ("alias", lambda: treeclone.jit(step, policy="alias", donate_argnums=0)),
        ("strict", lambda: treeclone.jit(step, policy="strict", donate_argnums=0)),
    ):
        f = jit()
        state = {"tree": f(arrays_in_dicts(n))}  # compiled; later calls hit the cache

        def call(f=f, state=state) -> None:
            state["tree"] = jax.block_until_ready(f(state["tree"]))

        out[name] = seconds(call, repeats)
    return out


COLUMNS = ("jax.jit", "alias", "strict", "call alias", "call strict")


def render(rows: list[tuple[str, int, dict]], info: dict, command: str, repeats: int) -> str:
    lines = [
        "## Scaling with the tree's size",
        "",
        f"Produced by `{command}` (from the repository root), median of {repeats} runs; each "
        "cell is milliseconds, then microseconds per unit of n (a child of the wide node, a "
        "level of nesting) in parentheses: flat down a column means linear.",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        "",
        "| what | n | " + " | ".join(COLUMNS) + " |",
        "|---|--:|" + "--:|" * len(COLUMNS),
    ]
    for what, n, cells in rows:
        parts = [
            f"{cells[c] * 1e3:,.1f} ({cells[c] * 1e6 / n:.2f})" if c in cells else "—"
            for c in COLUMNS
        ]
        lines.append(f"| {what} | {n:,} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 run: a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown file to update")
    parser.add_argument("--repeats", type=int, help="runs per cell (default 5; quick 1)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 5)
    sizes = (500, 4000) if args.quick else (10_000, 40_000, 100_000)
    array_sizes = (250, 1000) if args.quick else (2_500, 5_000, 10_000)
    deep = (200, 1000) if args.quick else (1_000, 10_000, 50_000)
    donated = (250, 2000) if args.quick else (2_500, 20_000)
    wide = (
        ("trace: list of n empty dicts", empty_dicts, sizes),
        ("trace: dict of n empty dicts", dict_of_empty_dicts, sizes),
        ("trace: list of n arrays", list_of_arrays, array_sizes),
        ("trace: dict of n arrays", dict_of_arrays, array_sizes),
    )
    rows = []
    for what, make, ns in wide:
        for n in ns:
            rows.append((what, n, trace_row(make, n, repeats)))
            print(rows[-1], flush=True)
    for n in deep:
        # jax.jit's flatten recurses natively: it fails on lists nested ~1,000 deep.
        cells = trace_row(deep_list, n, repeats, with_jax=False)
        rows.append(("trace: list nested n deep", n, cells))
        print(rows[-1])
    for n in donated:
        rows.append(("donated call (cached)", n, donation_row(n, repeats)))
        print(rows[-1])
    command = script_command("scaling_table.py", argv)
    write_section(args.out, render(rows, machine_info(), command, repeats), BEGIN, END, INTRO)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
