"""Which flat form of a training loop is the fastest: the harness's floor and its variants side
by side, with jax.jit and the treeclone contenders that run the same step.

    python benches/floor_probe.py                 # rewrites its section in docs/benchmarks.md
    python benches/floor_probe.py --quick --out /tmp/floor.md
    HARNESS=0 PROBE="benches/floor_probe.py --out OUT_DIR/floor.md" bash benches/device_run.sh

The floor (``treeclone.bench.workloads.floor_runner``) is one ``jax.jit`` over the flat arrays
of the state, the state unflattened and flattened at trace time only. What differs between the
variants is only how the arrays go in and out of that call, and when the loop lets go of the
old ones:

- ``list``: the arrays in one list argument (jax flattens it at each call); ``positional``:
  each array its own argument (``f(*flat, x, y)``);
- ``list out``: the replaced arrays returned as a list beside the loss; ``tuple out``: the
  replaced arrays and the loss as one flat tuple;
- ``held``: the arrays a call replaced are kept until the next call has returned (``held 3``:
  until three more calls have), as treeclone's lean path keeps a call's leaves on the
  platforms of ``HOLD_INPUT_PLATFORMS`` (``treeclone/_jit/inner.py``); otherwise the
  loop lets go of them right after the call that reads them, while that computation may still
  run;
- ``committed``: the state and the batch put on the device with ``jax.device_put(a, device)``
  (committed) instead of uncommitted;
- ``donated``: the replaced arrays donated (``donate_argnums``), so the computation takes
  their buffers.

``the harness's floor`` is ``floor_runner`` as it stands, holding the arrays as many calls as
``contenders.floor_hold`` says for the platform (``the harness's floor, not held`` / ``held 3``:
the same with 0 and 3; the other variants are written in the probe; ``list in, list out`` is
the floor of f25ccfa); ``treeclone.jit[alias], held`` / ``not
held`` run the harness's in-place step with treeclone's holding turned on and off at the
trace, as ``benches/release_probe.py`` does; ``treeclone.jit[strict]`` and
``treeclone.jit_partial[alias]`` run with the platform's default. Each contender's losses over
three steps must agree with jax.jit's (which the harness checks against the un-jitted
reference) before it is timed. Interleaved rounds (balanced orders), one batch of steps per
contender a round, each ending with ``jax.block_until_ready`` on the loss and the state's
arrays; the garbage collector off while a batch runs; the figures are the median time of a
step over rounds in µs, its interquartile range, and the ratio of medians to the harness's
floor. The Markdown goes between ``<!-- floor-probe:begin -->`` and ``<!-- floor-probe:end
-->`` (``floor-probe-tpu``, ... on a device).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import treeclone as tc
import treeclone.tree_util
from tree_table import DEFAULT_OUT, INTRO
from treeclone.bench import contenders as C
from treeclone.bench import workloads as W
from treeclone.bench.timing import interleaved, machine_info, script_command, write_section
from treeclone.bench.workloads import runners as WR

# workload: steps per batch (transformer_adam, bound by the device on a TPU, only with --only)
WORKLOADS = {"mlp_adam": 100, "nnx_train_20": 40}
STEPS = {**WORKLOADS, "transformer_adam": 20, "frozen_half": 22}
HARNESS_FLOOR = "the harness's floor"
# The harness's floor with another hold than its platform's (contenders.floor_hold).
FLOOR_HOLDS = {"the harness's floor, not held": 0, "the harness's floor, held 3": 3}
# Flat variants: name -> options of flat_runner.
VARIANTS = {
    "list in, list out": dict(positional=False, tuple_out=False),
    "positional in, list out": dict(positional=True, tuple_out=False),
    "positional in, tuple out": dict(positional=True, tuple_out=True),
    "list, held": dict(positional=False, tuple_out=False, hold=1),
    "positional, tuple out, held": dict(positional=True, tuple_out=True, hold=1),
    "positional, tuple out, held 3": dict(positional=True, tuple_out=True, hold=3),
    "positional, tuple out, held, committed": dict(
        positional=True, tuple_out=True, hold=1, commit=True
    ),
    "positional, tuple out, donated": dict(positional=True, tuple_out=True, donate=True),
}
OTHERS = (
    "jax.jit",
    HARNESS_FLOOR,
    "treeclone.jit[alias], held",
    "treeclone.jit[alias], not held",
    "treeclone.jit[strict]",
    "treeclone.jit_partial[alias]",
)
CONTENDERS = (*OTHERS[:2], *FLOOR_HOLDS, *VARIANTS, *OTHERS[2:])
_floor_runner = W.floor_runner  # the harness's, before floor_replaced swaps it
_jit_module = sys.modules["treeclone._jit.inner"]  # where the inner jit decides it


def markers(platform: str) -> tuple[str, str]:
    """``floor-probe`` on the CPU, else ``floor-probe-<platform>``: one section per device."""
    name = "floor-probe" + ("" if platform == "cpu" else f"-{platform}")
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def flat_runner(
    jit: Callable[..., Any],
    run_on_state: Callable[..., Any],
    state: Any,
    x: Any,
    y: Any,
    *,
    positional: bool,
    tuple_out: bool,
    hold: int = 0,
    commit: bool = False,
    donate: bool = False,
    **kw: Any,
) -> W.Runner:
    """A variant of ``workloads.floor_runner`` (same signature, the options above)."""
    flat, treedef = jax.tree.flatten(state)
    if commit:
        device = jax.devices()[0]
        flat = [jax.device_put(a, device) for a in flat]
        x, y = jax.device_put(x, device), jax.device_put(y, device)
    n = len(flat)
    changed: list[int] = []

    def flat_step(*args):
        leaves, (x, y) = (list(args[:n]), args[n:]) if positional else (args[0], args[1:])
        loss, after = run_on_state(jax.tree.unflatten(treedef, leaves), x, y)
        new = jax.tree.leaves(after)
        changed[:] = [i for i, (a, b) in enumerate(zip(new, leaves, strict=True)) if a is not b]
        out = [new[i] for i in changed]
        return (*out, loss) if tuple_out else (out, loss)

    traces = W.TraceCounter()
    options = {}
    if donate:  # which arrays the step replaces: one trace ahead, outside the counted ones
        jax.eval_shape(flat_step, *flat, x, y)
        options["donate_argnums"] = tuple(changed)
    f = jit(traces.wrap(flat_step), **options)
    ring: list[list[Any]] = []

    def run(k: int):
        loss = None
        for _ in range(k):
            result = f(*flat, x, y) if positional else f(flat, x, y)
            if tuple_out:
                *out, loss = result
            else:
                out, loss = result
            if hold:
                ring.append(flat[:])
                del ring[:-hold]
            for i, v in zip(changed, out, strict=True):
                flat[i] = v
        return loss, flat

    return W.Runner(run=run, traces=traces, **kw)


@contextlib.contextmanager
def floor_replaced(builder: Callable[..., W.Runner]) -> Iterator[None]:
    """``workloads.floor_runner`` replaced by ``builder`` where the workloads look it up at
    call: in ``workloads.runners``, the module that defines it."""
    saved = WR.floor_runner
    WR.floor_runner = builder
    try:
        yield
    finally:
        WR.floor_runner = saved


def make_runner(workload: W.Workload, contender: str) -> W.Runner:
    """The loop of ``contender`` on ``workload`` (not yet run)."""
    if contender == "jax.jit":
        return workload.runner(C.BASELINE, jax.jit)
    if contender == HARNESS_FLOOR:
        return workload.runner(C.FLOOR, jax.jit)
    if contender in VARIANTS or contender in FLOOR_HOLDS:
        builder = (
            functools.partial(flat_runner, **VARIANTS[contender])
            if contender in VARIANTS
            else functools.partial(_floor_runner, hold=FLOOR_HOLDS[contender])
        )
        with floor_replaced(builder):
            return workload.runner(C.FLOOR, jax.jit)
    if contender == "treeclone.jit_partial[alias]":
        return workload.runner(C.TC_PARTIAL, functools.partial(tc.jit_partial, policy="alias"))
    if contender == "treeclone.jit[strict]":
        return workload.runner(C.TC_STRICT, functools.partial(tc.jit, policy="strict"))
    return workload.runner(C.TC_ALIAS, functools.partial(tc.jit, policy="alias"))


def compiled(
    workload: W.Workload, contender: str, want: list[float] | None, rtol: float
) -> tuple[W.Runner, list[float]]:
    """The contender's runner after three steps, and their losses, which must agree with
    ``want`` if given (treeclone's holding set for the alias variants at the trace)."""
    made = make_runner(workload, contender)
    saved = _jit_module.HOLD_INPUT_PLATFORMS, _jit_module.HOLD_INPUT_BYTES
    if contender.endswith(", held"):  # read when the step is traced, at its first call
        _jit_module.HOLD_INPUT_PLATFORMS = saved[0] | {jax.devices()[0].platform}
    elif contender.endswith(", not held"):
        _jit_module.HOLD_INPUT_BYTES = -1
    try:
        losses = [float(made.run(1)[0]) for _ in range(3)]
    finally:
        _jit_module.HOLD_INPUT_PLATFORMS, _jit_module.HOLD_INPUT_BYTES = saved
    if want is not None and not np.allclose(losses, want, rtol=rtol, atol=1e-6):
        raise SystemExit(f"{contender}: losses {losses} disagree with jax.jit's {want}")
    return made, losses


def waited(outputs: tuple[Any, Any]) -> Any:
    """What a batch blocks on: the loss and the state's arrays."""
    loss, state = outputs
    return loss, treeclone.tree_util.tree_leaves(state)


def measure(
    name: str, contenders: list[str], steps: int, rounds: int, rtol: float
) -> dict[str, dict[str, float]]:
    """Each contender's median µs per step on workload ``name``, with its quartiles."""
    workload = W.WORKLOADS[name](jax.devices()[0], frozenset())
    runners, want = {}, None
    for c in contenders:  # jax.jit first: the others' losses are checked against its
        runners[c], losses = compiled(workload, c, want, rtol)
        want = want or losses
    for c in contenders:  # one untimed batch each
        jax.block_until_ready(waited(runners[c].run(steps)))
    samples: dict[str, list[float]] = {c: [] for c in contenders}
    gc.collect()
    for c in interleaved(contenders, rounds):
        gc.disable()
        try:
            start = time.perf_counter()
            jax.block_until_ready(waited(runners[c].run(steps)))
            samples[c].append((time.perf_counter() - start) / steps * 1e6)
        finally:
            gc.enable()
    out = {}
    for c, s in samples.items():
        q1, med, q3 = (float(v) for v in np.percentile(s, [25, 50, 75]))
        out[c] = {"median_us": med, "q1_us": q1, "q3_us": q3, "samples_us": s}
    return out


def render(results: dict[str, dict[str, dict[str, float]]], argv: list[str] | None) -> str:
    device = jax.devices()[0]
    rounds = len(next(iter(next(iter(results.values())).values()))["samples_us"])
    lines = [
        f"## Which flat loop is the floor ({device.platform})",
        "",
        f"Produced by `{script_command('floor_probe.py', argv)}` (from the repository root) "
        f"on `{device.device_kind}`: {rounds} interleaved rounds; each cell is the median time "
        "of a step in µs, its interquartile range, and its ratio to the harness's floor "
        "(module docstring of `benches/floor_probe.py` for what each variant does).",
        "",
        *(f"- {k}: {v}" for k, v in machine_info().items()),
        "",
        "| contender | " + " | ".join(f"`{n}`" for n in results) + " |",
        "|---|" + "--:|" * len(results),
    ]
    for c in next(iter(results.values())):
        cells = []
        for n in results:
            r, floor = results[n][c], results[n][HARNESS_FLOOR]["median_us"]
            cells.append(
                f"{r['median_us']:,.1f} ({r['q1_us']:,.1f}–{r['q3_us']:,.1f}) "
                f"{r['median_us'] / floor:.2f}x"
            )
        lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown file to update")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 5 steps per workload: a smoke run"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; quick 2)")
    parser.add_argument(
        "--only",
        help=f"comma-separated workloads (default {', '.join(WORKLOADS)}; or {', '.join(STEPS)})",
    )
    parser.add_argument(
        "--contenders",
        help="contenders beside jax.jit and the harness's floor, separated by ';' (default: all)",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 15)
    rtol = 1e-4 if jax.default_backend() == "cpu" else 1e-2
    names = args.only.split(",") if args.only else list(WORKLOADS)
    chosen = args.contenders.split(";") if args.contenders else CONTENDERS
    unknown = [c for c in [*names, *chosen] if c not in STEPS and c not in CONTENDERS]
    if unknown:
        parser.error(f"unknown workloads or contenders: {', '.join(unknown)}")
    contenders = [c for c in CONTENDERS if c in OTHERS[:2] or c in chosen]
    results = {}
    for name in names:
        steps = 5 if args.quick else STEPS[name]
        results[name] = measure(name, contenders, steps, rounds, rtol)
        print(name, {c: round(r["median_us"], 1) for c, r in results[name].items()}, flush=True)
    section = render(results, argv)
    print(section)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    write_section(args.out, section, *markers(jax.devices()[0].platform), intro=INTRO)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
