"""Instructions per call of ``treeclone.jit`` and ``jax.jit`` on the jit table's calls, counted
by valgrind's callgrind: a measure that does not drift with the machine's load, for reading
next to the timed tables (whose ratios on a 2-core machine move by several per cent between
runs). No speed claim is made from it: the timed tables are the claims.

    python benches/call_instructions.py                  # rewrites its table in the docs
    python benches/call_instructions.py --out /tmp/instr.md --calls 300
    python benches/call_instructions.py --nnx --calls 50   # flax's overhead model, printed

Each case of ``jit_cases.py`` runs in one process under ``valgrind --tool=callgrind
--instr-atstart=no``: every contender is compiled and warmed up uninstrumented, then, for each,
counting is switched on (``callgrind_control -i on``) for ``--calls`` blocked calls, the count
dumped, and again for three times as many; the difference of the two counts over the difference
in calls is the cost of one call, every thread included (the Python loop, treeclone, JAX's
dispatch, XLA's execution of the computation, whose worker threads' share varies by a per cent
or two with their scheduling). The Markdown goes between
``<!-- call-instructions:begin -->`` and ``<!-- call-instructions:end -->``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
from jit_cases import CASES, CONTENDERS, build_case, jitted
from tree_table import DEFAULT_OUT, INTRO
from treeclone.bench.timing import machine_info, script_command, write_section

BEGIN = "<!-- call-instructions:begin -->"
END = "<!-- call-instructions:end -->"
HERE = Path(__file__).resolve().parent


def _control(*flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(os.getpid())], check=True, capture_output=True)


def count_windows(call: Callable[[], Any], calls: int) -> None:
    """Under callgrind: ``call()`` (a blocked call) 20 times uncounted (compiled, and at the
    steady state of the native call's caches), then counted ``calls`` and ``3 * calls``
    times, each count dumped (``total`` reads them)."""
    for _ in range(20):
        call()
    for n in (calls, 3 * calls):
        _control("--zero")
        _control("--instr=on")
        for _ in range(n):
            call()
        _control("--instr=off")
        _control("--dump")


def child(case: str, calls: int) -> None:
    """Under callgrind: each contender's two counted windows, dumped in order."""
    args = build_case(case)[1]
    for contender in CONTENDERS:
        fun = jitted(contender, case)
        count_windows(lambda fun=fun: jax.block_until_ready(fun(*args)), calls)


# flax's own overhead benchmark (the harness's ``nnx_empty_<depth>``: an nnx model of ``depth``
# Blocks with its ``nnx.Optimizer``, an empty step): ``--nnx`` counts these contenders on it.
NNX_CONTENDERS = ("treeclone.jit[alias]", "flax.nnx.jit_partial", "treeclone.jit_partial[alias]")
NNX_DEPTHS = (20, 100)


def nnx_call(contender: str, depth: int):
    """A call of ``contender`` on flax's overhead model at ``depth`` (``fun()``: one step)."""
    import jax.numpy as jnp
    import optax
    import treeclone as tc
    from flax import nnx
    from treeclone.bench.workloads import overhead_model_class

    model = overhead_model_class()(32, depth, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
    x, y = jnp.ones((100, 1)), jnp.ones((100, 1))

    def step(model, optimizer, x, y):  # the workload's empty body
        return None

    if contender == "treeclone.jit[alias]":
        jitted = tc.jit(step, policy="alias")
        return lambda: jitted(model, optimizer, x, y)
    if contender == "flax.nnx.jit_partial":
        partial = nnx.jit_partial(step, model, optimizer, graph=False)
    else:
        partial = tc.jit_partial(step, model, optimizer, policy="alias")
    return lambda: partial(x, y)


def nnx_child(depth: int, calls: int) -> None:
    """Under callgrind: each nnx contender's two counted windows, dumped in order."""
    for contender in NNX_CONTENDERS:
        fun = nnx_call(contender, depth)
        count_windows(lambda fun=fun: jax.block_until_ready(fun()), calls)


def total(path: Path) -> int:
    """The count of a dump (its ``totals:`` line; ``summary:`` reads 0 in a dump on request)."""
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"{path}: no totals line (callgrind's dump format changed?)")


def counted_dumps(script: str, child_args: list[str], tmp: Path, what: str) -> list[Path]:
    """Run ``script --child *child_args`` under callgrind, counting nothing until the child
    switches counting on (``count_windows``), and its dumps in ``tmp``, in order."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={tmp / 'callgrind.out'}",
        sys.executable,
        script,
        "--child",
        *child_args,
    ]
    run = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
    if run.returncode != 0:
        raise SystemExit(f"{what}: valgrind failed:\n{run.stderr[-3000:]}")
    return sorted(tmp.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))


def per_call(counts: list[int], contenders: Sequence[str], calls: int, what: str) -> dict:
    """Each contender's instructions per call: the difference of its two windows' counts
    (``calls`` and ``3 * calls`` calls) over ``2 * calls``."""
    if len(counts) != 2 * len(contenders):
        raise SystemExit(f"{what}: expected {2 * len(contenders)} dumps, got {len(counts)}")
    return {c: (counts[2 * i + 1] - counts[2 * i]) / (2 * calls) for i, c in enumerate(contenders)}


def measure(case: str, calls: int) -> dict[str, float]:
    """Instructions per call of each contender on ``case`` (``nnx_empty_<depth>``: the nnx
    contenders on flax's overhead model)."""
    contenders = NNX_CONTENDERS if case.startswith("nnx_empty_") else CONTENDERS
    with tempfile.TemporaryDirectory() as tmp:
        parts = counted_dumps(__file__, [case, "--calls", str(calls)], Path(tmp), case)
        counts = [total(p) for p in parts]
    return per_call(counts, contenders, calls, case)


def render(results: dict, info: dict[str, str], command: str, calls: int) -> str:
    lines = [
        "## jit call path in instructions",
        "",
        f"Produced by `{command}` (from the repository root): instructions per blocked call "
        f"counted by valgrind's callgrind, every thread included (difference of {3 * calls:,} "
        f"and {calls:,} calls, after warm-up), in thousands; ratio = treeclone's count / "
        "jax.jit's. Load does not move these counts, but they include XLA's worker threads, "
        "whose share varies with their scheduling: on a call with real computation two "
        "contenders doing the same work can differ by a per cent or two (clone is jax.jit's "
        "call plus a check). Time per instruction differs too (allocation, caches): read them "
        "next to the timed tables, not instead of them.",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        "",
        "| call | jax.jit k instr | " + " | ".join(f"{c} k (ratio)" for c in CONTENDERS[1:]) + " |",
        "|---|--:|" + "--:|" * (len(CONTENDERS) - 1),
    ]
    for case, counts in results.items():
        base = counts["jax.jit"]
        cells = [f"{counts[c] / 1e3:,.1f} ({counts[c] / base:.3f})" for c in CONTENDERS[1:]]
        lines.append(f"| {case} | {base / 1e3:,.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="calls in the first window")
    parser.add_argument("--out", type=Path, help="Markdown file to update (default: the docs)")
    parser.add_argument(
        "--nnx",
        action="store_true",
        help="count treeclone.jit[alias], nnx.jit_partial and treeclone.jit_partial on flax's "
        "overhead model (nnx_empty_20 and nnx_empty_100) and print them; the docs are left alone",
    )
    parser.add_argument("--child", metavar="CASE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child.startswith("nnx_empty_"):
            nnx_child(int(args.child.rsplit("_", 1)[1]), args.calls)
        else:
            child(args.child, args.calls)
        return 0
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("valgrind (with callgrind_control) is needed: apt-get install valgrind")
    if args.nnx:
        cases = [f"nnx_empty_{depth}" for depth in NNX_DEPTHS]
        with ThreadPoolExecutor(max_workers=2) as pool:
            found = dict(zip(cases, pool.map(lambda c: measure(c, args.calls), cases), strict=True))
        base = NNX_CONTENDERS[1]
        for case, per_call in found.items():
            cells = ", ".join(
                f"{c} {n / 1e3:,.1f}k ({n / per_call[base]:.2f}x)" for c, n in per_call.items()
            )
            print(f"{case}: {cells}  (ratio: to {base})")
        return 0
    with ThreadPoolExecutor(max_workers=2) as pool:  # one valgrind per core
        counts = dict(zip(CASES, pool.map(lambda c: measure(c, args.calls), CASES), strict=True))
    for case, per_call in counts.items():
        print(case, {c: round(n) for c, n in per_call.items()})
    command = script_command("call_instructions.py", argv)
    out = args.out or DEFAULT_OUT
    write_section(out, render(counts, machine_info(), command, args.calls), BEGIN, END, INTRO)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
