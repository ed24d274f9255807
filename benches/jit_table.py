"""Measure the call path of ``treeclone.jit`` against ``jax.jit`` and write its table.

    python benches/jit_table.py                  # full run, rewrites the table in the docs
    python benches/jit_table.py --quick --out /tmp/jit.md

The calls of ``jit_cases.py`` (which ``test_jit_bench.py`` times too): an MLP train step with
Adam (dispatch-bound), the identity function over a ~600-leaf transformer+Adam tree (pure call
overhead), a step that trains half of the parameters and returns the other half untouched, a
near-empty call on a 49-leaf tree (dispatch alone), and a trivial function with a static
argument (``static_argnums=1``). Each call is blocked on
(``jax.block_until_ready``), compiled before timing, and checked against ``jax.jit``'s result.
Contenders are interleaved in rounds (``timing.interleaved``'s balanced orders), batches of about
``--batch-ms``, the garbage collector off; the figure is the median over rounds of the time per
call, and the ratio is treeclone's median over jax.jit's (below 1 means treeclone is faster).
The Markdown goes between ``<!-- jit-table:begin -->`` and ``<!-- jit-table:end -->``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np
from jit_cases import CASES, CONTENDERS, build_case, jitted
from tree_table import DEFAULT_OUT, INTRO
from treeclone.bench.timing import (
    BoundCall,
    machine_info,
    measure_cell,
    script_command,
    write_section,
)

BEGIN = "<!-- jit-table:begin -->"
END = "<!-- jit-table:end -->"


def _blocking(fun, args) -> BoundCall:
    return BoundCall(lambda: jax.block_until_ready(fun(*args)))


def _check(case: str) -> None:
    args = build_case(case)[1]
    expected = jitted("jax.jit", case)(*args)
    for contender in CONTENDERS[1:]:
        got = jitted(contender, case)(*args)
        if jax.tree.structure(got) != jax.tree.structure(expected) or not all(
            np.allclose(a, b)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True)
        ):
            raise SystemExit(f"{contender} disagrees with jax.jit on {case}: nothing timed")


def render(results: dict, info: dict[str, str], command: str, rounds: int) -> str:
    lines = [
        "## jit call path",
        "",
        f"Produced by `{command}` (from the repository root), {rounds} interleaved rounds, "
        "median per call in microseconds; ratio = treeclone's median / jax.jit's (lower is "
        "better for treeclone).",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        "",
        "| call | what | jax.jit µs | clone µs (ratio) | alias µs (ratio) | strict µs (ratio) |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for case, cells in results.items():
        base = cells["jax.jit"]["median_us"]
        parts = [
            f"{cells[c]['median_us']:,.1f} ({cells[c]['median_us'] / base:.2f})"
            for c in CONTENDERS[1:]
        ]
        lines.append(f"| {case} | {CASES[case]} | {base:,.1f} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds: a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown file to update")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 25; quick 3)")
    parser.add_argument("--batch-ms", type=float, help="time per batch (default 20; quick 5)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 25)
    batch_ns = int((args.batch_ms or (5 if args.quick else 20)) * 1e6)
    results = {}
    for case in CASES:
        _check(case)
        call_args = build_case(case)[1]
        calls = {c: _blocking(jitted(c, case), call_args) for c in CONTENDERS}
        for call in calls.values():
            call()  # compile
        results[case] = measure_cell(calls, rounds, batch_ns)
        print(case, {c: round(r["median_us"], 1) for c, r in results[case].items()})
    command = script_command("jit_table.py", argv)
    section = render(results, machine_info(), command, rounds)
    write_section(args.out, section, BEGIN, END, intro=INTRO)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
