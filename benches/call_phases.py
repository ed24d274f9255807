"""Where one treeclone call's time goes: the phases of ``treeclone.jit`` / ``jit_partial`` on
the harness's models, for reading next to the harness's ratios (what limits a ratio).

    python benches/call_phases.py                  # rewrites its table in docs/benchmarks.md
    python benches/call_phases.py --out /tmp/phases.md

Phases, each timed over many calls after compilation (medians of rounds, microseconds):
``prepare`` (flatten the arguments with identity, or check and join the bound ones, and box
them), ``jitted`` (JAX's dispatch of the inner jit: its own flatten of the boxed leaves and
the launch of the computation), ``apply`` (the plan: rebuild the result, write back), and for
context the flatten alone (``flatten_shared``) and, for ``jit_partial``, the check of the
bound containers (``snapshot``). The phases are timed one by one, so they add up to a little
more than a whole call, whose computation runs while the next phases do. No speed claim is
made from this table (the harness's interleaved ratios are the claims): it says where the
time of the calls the harness measures goes. The Markdown goes between
``<!-- call-phases:begin -->`` and ``<!-- call-phases:end -->``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import treeclone as tc
from tree_table import DEFAULT_OUT, INTRO
from treeclone import _native
from treeclone.bench import models as M
from treeclone.bench.timing import machine_info, script_command, write_section
from treeclone.bench.workloads import inplace_step, mlp_data, overhead_model_class
from treeclone.policies import ALIAS

BEGIN = "<!-- call-phases:begin -->"
END = "<!-- call-phases:end -->"


def _median_us(fn: Callable[[], Any], n: int = 200, rounds: int = 7) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


def phases(jitted: tc.Jitted, args: tuple, bound: Any = None) -> dict[str, float]:
    """Median time of each phase of ``jitted(*args)`` (``bound``: a jit_partial's)."""
    call = jitted._prepare(ALIAS, args, {}, bound)
    result = call.jitted(call.box, call.donated)
    jax.block_until_ready(result.leaves)
    out = {
        "prepare": _median_us(lambda: jitted._prepare(ALIAS, args, {}, bound)),
        "jitted": _median_us(lambda: jax.block_until_ready(call.jitted(call.box, call.donated))),
        "flatten_shared": _median_us(lambda: _native.flatten_shared((*args, {}))),
    }
    if bound is not None:  # before any write-back below: it would make the check fail early
        out["snapshot"] = _median_us(bound.snapshot.unchanged)
    out["apply"] = _median_us(
        lambda: result.info.plan.apply(call.leaves, call.objects, result.leaves)
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown file to update")
    args = parser.parse_args(argv)
    import optax
    from flax import nnx

    sizes = (32, 64, 64, 10)
    tx = optax.adam(1e-3)
    x, y = (jnp.asarray(a) for a in mlp_data(sizes, 32))
    params = jax.tree.map(jnp.asarray, M.mlp_init(0, sizes))
    state = {"params": params, "opt_state": tx.init(params)}
    step = tc.jit(inplace_step(M.mlp_loss, tx), policy="alias")
    step(state, x, y)
    rows = {"mlp_adam, jit[alias]": phases(step, (state, x, y))}

    cls = overhead_model_class()
    for depth, body in ((20, "empty"), (20, "train"), (100, "empty")):
        model = cls(32, depth, nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
        bx, by = jnp.ones((32, 1)), jnp.ones((32, 1))

        def train(model, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
            optimizer.update(model, grads)
            return loss

        fn = train if body == "train" else (lambda model, optimizer, x, y: None)
        plain = tc.jit(fn, policy="alias")
        plain(model, optimizer, bx, by)
        rows[f"nnx_{body}_{depth}, jit[alias]"] = phases(plain, (model, optimizer, bx, by))
        bound = tc.jit_partial(fn, model, optimizer)
        bound(bx, by)
        rows[f"nnx_{body}_{depth}, jit_partial[alias]"] = phases(
            bound._jitted, (model, optimizer, bx, by), bound._bound
        )
    names = ["prepare", "jitted", "apply", "flatten_shared", "snapshot"]
    lines = [
        "## Where a call's time goes",
        "",
        f"Produced by `{script_command('call_phases.py', argv)}` (from the repository root): "
        "the median time of each phase of one call, timed phase by phase after compilation "
        "(module docstring of `benches/call_phases.py`); microseconds. `prepare`: flatten the "
        "arguments with identity (for `jit_partial`: check the bound ones and flatten the "
        "rest) and box them; `jitted`: JAX's dispatch of the inner jit and the computation; "
        "`apply`: the plan (results, write-back); `flatten_shared`: the flatten alone; "
        "`snapshot`: `jit_partial`'s check of the bound containers.",
        "",
        *(f"- {k}: {v}" for k, v in machine_info().items()),
        "",
        "| call | " + " | ".join(f"{n} µs" for n in names) + " |",
        "|---|" + "--:|" * len(names),
    ]
    for row, cells in rows.items():
        values = [f"{cells[n]:,.1f}" if n in cells else "—" for n in names]
        lines.append(f"| {row} | " + " | ".join(values) + " |")
    section = "\n".join(lines) + "\n"
    print(section)
    write_section(args.out, section, BEGIN, END, intro=INTRO)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
