"""When a training loop's old arrays are let go: the harness's loops on the default device with
and without each call's arguments held a little longer, and treeclone's lean path with and
without its holding of the last call's leaves (``HOLD_INPUT_PLATFORMS`` and
``HOLD_INPUT_BYTES`` in ``treeclone/_jit/inner.py``: the measure behind them).

    python benches/release_probe.py                  # rewrites its section in docs/benchmarks.md
    python benches/release_probe.py --out /tmp/release.md --rounds 9
    HARNESS=0 PROBE="benches/release_probe.py --out OUT_DIR/release.md" bash benches/device_run.sh

A loop ``params, opt_state, loss = step(params, opt_state, x, y)`` lets go of the old state
right after the call that reads it, while that computation may still run. On a TPU (jax 0.10,
v5e) that cost the host a wait at every step; this probe measures it where it runs. Contenders,
each on the workload's own loop from ``treeclone.bench.workloads``: ``jax.jit``; ``jax.jit``
with each call's arguments (and a shallow copy of each dict among them) held three calls longer
(``jax.jit, held``); ``treeclone.jit[strict]`` and ``[alias]`` traced with the holding turned
on for this platform (``held``) and off (``not held``). Interleaved rounds (balanced orders),
one batch of steps per contender a round, each batch ending with ``jax.block_until_ready``; the
garbage collector off; the figure is the median over rounds of the time per step, and the
ratio is over ``jax.jit``'s. The Markdown goes between ``<!-- release-probe:begin -->`` and
``<!-- release-probe:end -->`` (``release-probe-tpu``, ... on a device).
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import treeclone as tc
from tree_table import DEFAULT_OUT, INTRO
from treeclone.bench import contenders as C
from treeclone.bench import workloads as W
from treeclone.bench.timing import interleaved, machine_info, script_command, write_section


def markers(platform: str) -> tuple[str, str]:
    """The section's markers on ``platform``: ``release-probe`` on the CPU, else
    ``release-probe-<platform>``, so that each device's run keeps its own section."""
    name = "release-probe" + ("" if platform == "cpu" else f"-{platform}")
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


WORKLOADS = {"mlp_adam": 100, "nnx_train_20": 60}  # workload: steps per batch
CONTENDERS = (
    "jax.jit",
    "jax.jit, held",
    "treeclone.jit[strict], held",
    "treeclone.jit[strict], not held",
    "treeclone.jit[alias], held",
    "treeclone.jit[alias], not held",
)
_jit_module = sys.modules["treeclone._jit.inner"]  # where the inner jit decides it


def held(jit: Callable[..., Any]) -> Callable[..., Any]:
    """``jit`` whose wrapped functions hold each call's arguments three calls longer."""

    def wrap(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        jitted = jit(fun, *args, **kwargs)
        ring: list[Any] = []

        def call(*a: Any, **k: Any) -> Any:
            ring.append((a, [dict(v) for v in a if isinstance(v, dict)]))
            del ring[:-3]
            return jitted(*a, **k)

        return call

    return wrap


def runner(workload: W.Workload, contender: str) -> W.Runner:
    """The loop of ``contender`` on ``workload``, compiled (five steps run)."""
    name, _, variant = contender.partition(", ")
    if name == "jax.jit":
        jit = held(jax.jit) if variant == "held" else jax.jit
        made = workload.runner(C.BASELINE, jit)
    else:
        policy = name[len("treeclone.jit[") : -1]
        which = C.TC_ALIAS if policy == "alias" else C.TC_STRICT
        made = workload.runner(which, functools.partial(tc.jit, policy=policy))
    saved = _jit_module.HOLD_INPUT_PLATFORMS, _jit_module.HOLD_INPUT_BYTES
    if variant == "held":  # read when the step is traced, at its first call
        _jit_module.HOLD_INPUT_PLATFORMS = saved[0] | {jax.devices()[0].platform}
    elif variant == "not held":
        _jit_module.HOLD_INPUT_BYTES = -1
    try:
        jax.block_until_ready(made.run(5))
    finally:
        _jit_module.HOLD_INPUT_PLATFORMS, _jit_module.HOLD_INPUT_BYTES = saved
    return made


def measure(name: str, steps: int, rounds: int) -> dict[str, float]:
    """Median µs per step of each contender on workload ``name``."""
    workload = W.WORKLOADS[name](jax.devices()[0], frozenset())
    runners = {c: runner(workload, c) for c in CONTENDERS}
    samples: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    gc.collect()
    gc.disable()
    try:
        for c in interleaved(CONTENDERS, rounds):
            start = time.perf_counter()
            jax.block_until_ready(runners[c].run(steps))
            samples[c].append((time.perf_counter() - start) / steps * 1e6)
    finally:
        gc.enable()
    return {c: statistics.median(s) for c, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown file to update")
    parser.add_argument(
        "--quick", action="store_true", help="mlp_adam alone, 2 rounds of 5 steps: a smoke run"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; quick 2)")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 15)
    results = {}
    workloads = {"mlp_adam": 5} if args.quick else WORKLOADS
    for name, steps in workloads.items():
        results[name] = measure(name, steps, args.rounds)
        print(name, {c: round(v, 1) for c, v in results[name].items()}, flush=True)
    device = jax.devices()[0]
    lines = [
        f"## When old arrays are let go ({device.platform})",
        "",
        f"Produced by `{script_command('release_probe.py', argv)}` (from the repository "
        f"root) on `{device.device_kind}`: {args.rounds} interleaved rounds, the median time "
        "of a step in µs and its ratio to `jax.jit`'s (module docstring of "
        "`benches/release_probe.py`). `jax.jit, held`: each call's arguments kept three calls "
        "longer by the loop; treeclone's `held` and `not held`: its lean path traced with its "
        "holding of the last call's leaves until the next call turned on and off (it is on "
        "for the platforms of `HOLD_INPUT_PLATFORMS`).",
        "",
        *(f"- {k}: {v}" for k, v in machine_info().items()),
        "",
        "| contender | " + " | ".join(f"`{n}`" for n in results) + " |",
        "|---|" + "--:|" * len(results),
    ]
    for c in CONTENDERS:
        cells = [
            f"{results[n][c]:,.1f} ({results[n][c] / results[n]['jax.jit']:.2f}x)" for n in results
        ]
        lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
    section = "\n".join(lines) + "\n"
    print(section)
    write_section(args.out, section, *markers(device.platform), intro=INTRO)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
