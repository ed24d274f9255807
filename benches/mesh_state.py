"""A sharded training state on 8 CPU devices (issue 48): the step time of treeclone's in-place
forms, whose written-back arrays keep their shardings by themselves, against ``jax.jit`` with
``out_shardings`` naming every leaf's sharding and the state donated.

    python benches/mesh_state.py                 # rewrites its section in docs/benchmarks.md
    python benches/mesh_state.py --out /tmp/mesh.md --rounds 9
    python benches/mesh_state.py --quick --out /tmp/mesh.md   # a smoke run (CI)

The workload: an MLP (64 -> 512 -> 64) trained with optax AdamW on a state dict ``{"params",
"opt", "step"}`` on a ``data=4 x model=2`` mesh of 8 CPU devices (the script sets
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before importing JAX), ``w1`` sharded
``P(None, "model")``, ``w2`` ``P("model", None)``, the rest replicated, a batch of 256 rows
split over ``data``. Contenders, each on its own copy of the state: ``jax.jit`` of the
functional step (``state, loss = step(state, x)``) with ``out_shardings`` and
``donate_argnums=0``; ``treeclone.jit[alias]`` of the step that updates the state in place
(``loss = step(state, x)``), without and with ``donate_argnums=0``; ``treeclone.jit_partial
[alias]`` of it with the state bound, without and with donation. Before timing, each runs 3
steps and the script checks that every leaf of its state is placed as it started (a contender
that is not is reported, not timed). Interleaved rounds (balanced orders), one batch of steps
per contender a round, each batch ending with ``jax.block_until_ready``; the garbage collector
off; the figure is the median over rounds of the time per step, and the ratio is over
``jax.jit``'s. The Markdown goes between ``<!-- mesh-state:begin -->`` and
``<!-- mesh-state:end -->``.
"""

from __future__ import annotations

import os

DEVICES = 8
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={DEVICES}")

import argparse  # noqa: E402 - XLA_FLAGS first
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import treeclone as tc  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tree_table import DEFAULT_OUT, INTRO  # noqa: E402
from treeclone.bench.timing import (  # noqa: E402
    interleaved,
    machine_info,
    script_command,
    write_section,
)

MARKERS = ("<!-- mesh-state:begin -->", "<!-- mesh-state:end -->")
SIZES = (64, 512, 64)
BATCH = 256
JAX_JIT = "jax.jit, out_shardings, donated"
CONTENDERS = (
    JAX_JIT,
    "treeclone.jit[alias]",
    "treeclone.jit[alias], donated",
    "treeclone.jit_partial[alias]",
    "treeclone.jit_partial[alias], donated",
)
TX = optax.adamw(1e-3)


def loss_fn(params: dict, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"]) ** 2)


def step_in_place(state: dict, x: jax.Array) -> jax.Array:
    """The step as plain Python writes it: the state dict updated in place."""
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], x)
    updates, state["opt"] = TX.update(grads, state["opt"], state["params"])
    state["params"] = optax.apply_updates(state["params"], updates)
    state["step"] = state["step"] + 1
    return loss


def functional_step(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
    state = dict(state)
    return state, step_in_place(state, x)


class Setup:
    """The mesh, each leaf's sharding, and fresh copies of the state."""

    def __init__(self) -> None:
        devices = np.array(jax.devices())
        if devices.size != DEVICES:
            raise SystemExit(f"{devices.size} devices, expected {DEVICES}: XLA_FLAGS was set")
        self.mesh = Mesh(devices.reshape(4, 2), ("data", "model"))
        self.spec = {"w1": P(None, "model"), "w2": P("model", None)}
        rng = np.random.default_rng(0)
        n_in, hidden, n_out = SIZES
        self.params = {
            "w1": (rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32),
            "b1": np.zeros(hidden, np.float32),
            "w2": (rng.standard_normal((hidden, n_out)) / np.sqrt(hidden)).astype(np.float32),
            "b2": np.zeros(n_out, np.float32),
        }
        x = rng.standard_normal((BATCH, n_in)).astype(np.float32)
        self.x = jax.device_put(x, NamedSharding(self.mesh, P("data")))

    def shardings(self, state: dict) -> dict:
        def pick(path: tuple, _: Any) -> NamedSharding:
            key = getattr(path[-1], "key", None)
            return NamedSharding(self.mesh, self.spec.get(key, P()))

        return jax.tree_util.tree_map_with_path(pick, state)

    def state(self) -> dict:
        params = jax.tree.map(jnp.asarray, self.params)
        state = {"params": params, "opt": TX.init(params), "step": jnp.zeros((), jnp.int32)}
        return jax.device_put(state, self.shardings(state))


def placed_as(state: dict, start: dict) -> bool:
    now = jax.tree.leaves(jax.tree.map(lambda x: x.sharding, state))
    was = jax.tree.leaves(start)
    leaves = jax.tree.leaves(state)
    return all(a.is_equivalent_to(b, x.ndim) for a, b, x in zip(now, was, leaves, strict=True))


def loop(contender: str, setup: Setup) -> tuple[Callable[[int], Any], Callable[[], dict]]:
    """``(run(n), state())``: ``n`` steps of ``contender``'s loop, and its state now."""
    state = setup.state()
    x = setup.x
    if contender == JAX_JIT:
        shardings = setup.shardings(state)
        jitted = jax.jit(functional_step, out_shardings=(shardings, None), donate_argnums=0)
        box = [state]

        def run_functional(n: int) -> Any:
            current, loss = box[0], None
            for _ in range(n):
                current, loss = jitted(current, x)
            box[0] = current
            return loss

        return run_functional, lambda: box[0]
    donate = {"donate_argnums": 0} if contender.endswith("donated") else {}
    if contender.startswith("treeclone.jit_partial"):
        bound = tc.jit_partial(step_in_place, state, policy="alias", **donate)
        step: Callable[..., Any] = lambda: bound(x)  # noqa: E731
    else:
        jitted_in_place = tc.jit(step_in_place, policy="alias", **donate)
        step = lambda: jitted_in_place(state, x)  # noqa: E731

    def run_in_place(n: int) -> Any:
        loss = None
        for _ in range(n):
            loss = step()
        return loss

    return run_in_place, lambda: state


def measure(steps: int, rounds: int) -> tuple[dict[str, float], dict[str, bool]]:
    """Median µs per step of each contender, and whether its state kept its placement."""
    setup = Setup()
    start = jax.tree.map(lambda x: x.sharding, setup.state())
    loops, kept = {}, {}
    for contender in CONTENDERS:
        run, state = loop(contender, setup)
        jax.block_until_ready(run(3))
        kept[contender] = placed_as(state(), start)
        if kept[contender]:
            loops[contender] = run
    samples: dict[str, list[float]] = {c: [] for c in loops}
    gc.collect()
    gc.disable()
    try:
        for c in interleaved(list(loops), rounds):
            t0 = time.perf_counter()
            jax.block_until_ready(loops[c](steps))
            samples[c].append((time.perf_counter() - t0) / steps * 1e6)
    finally:
        gc.enable()
    return {c: statistics.median(s) for c, s in samples.items()}, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown file to update")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 steps: a smoke run")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; quick 2)")
    parser.add_argument("--steps", type=int, help="steps per batch (default 20; quick 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 15)
    steps = args.steps or (3 if args.quick else 20)
    times, kept = measure(steps, rounds)
    base = times.get(JAX_JIT)
    lines = [
        f"## A sharded state on {DEVICES} CPU devices",
        "",
        f"Produced by `{script_command('mesh_state.py', argv)}` (from the repository root): "
        f"{rounds} interleaved rounds of {steps} steps, the median time of a step in µs and "
        f"its ratio to `{JAX_JIT}`'s (module docstring of `benches/mesh_state.py`: an AdamW "
        "MLP step on a `data=4 x model=2` mesh).",
        "",
        *(f"- {k}: {v}" for k, v in machine_info(extra={"devices": str(DEVICES)}).items()),
        "",
        "| contender | µs per step | ratio | state placed as at the start |",
        "|---|--:|--:|---|",
    ]
    for c in CONTENDERS:
        t = times.get(c)
        cell = "—" if t is None else f"{t:,.1f}"
        ratio = "—" if t is None or base is None else f"{t / base:.2f}x"
        lines.append(f"| `{c}` | {cell} | {ratio} | {'yes' if kept[c] else 'no'} |")
    section = "\n".join(lines) + "\n"
    print(section)
    write_section(args.out, section, *MARKERS, intro=INTRO)
    print(f"wrote {args.out}")
    return 0 if all(kept.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
