"""Where one treeclone call's time goes: the phases of ``treeclone.jit`` / ``jit_partial`` on
the harness's models, for reading next to the harness's ratios (what limits a ratio).

    python benches/call_phases.py                  # rewrites its table in docs/benchmarks.md
    python benches/call_phases.py --out /tmp/phases.md

Both run on the lean path (``_native.LeanCall``: one native call per call). Phases, each timed
over many calls after compilation (medians of rounds, microseconds): ``call`` (a whole call,
waited for), ``flatten`` (the arguments flattened with identity; for ``jit_partial``, the
bound ones checked and joined with the others flattened: ``BoundArguments.join``),
``jitted`` (JAX's dispatch of the inner jit on the distinct leaves and the computation,
waited for), ``apply`` (the plan: rebuild the result, write back), and for
``jit_partial`` the check of the bound containers alone (``snapshot``, part of ``flatten``).
The phases are timed one by one, so ``flatten + jitted + apply`` is a little more than
``call``, whose computation runs while the next phases do. No speed claim is made from this
table (the harness's interleaved ratios are the claims): it says where the time of the calls
the harness measures goes. The Markdown goes between ``<!-- call-phases:begin -->`` and
``<!-- call-phases:end -->``.
"""

from __future__ import annotations

import argparse
import functools
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
from treeclone._jit.call import lean_call_record
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


def phases(jitted: tc.Jitted, args: tuple, whole: Callable[[], Any], bound: Any = None):
    """Median time of each phase of ``jitted(*args)`` (``bound``: a jit_partial's, whose call
    is ``whole``)."""
    out = {"call": _median_us(lambda: jax.block_until_ready(whole()))}
    # The leaves the native call passes, and its key.
    call = lean_call_record(jitted._lean_for(ALIAS).prepare(args, {}, bound))
    result = call.jitted(call.key, call.donated, *call.kept)
    jax.block_until_ready(result.leaves)
    if bound is None:
        out["flatten"] = _median_us(lambda: _native.flatten_shared((*args, {})))
    else:
        out["flatten"] = _median_us(lambda: bound.join(args, {}))
    out["jitted"] = _median_us(
        lambda: jax.block_until_ready(call.jitted(call.key, call.donated, *call.kept))
    )
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
    rows = {
        "mlp_adam, jit[alias]": phases(step, (state, x, y), functools.partial(step, state, x, y))
    }

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
        rows[f"nnx_{body}_{depth}, jit[alias]"] = phases(
            plain, (model, optimizer, bx, by), functools.partial(plain, model, optimizer, bx, by)
        )
        bound = tc.jit_partial(fn, model, optimizer)
        bound(bx, by)
        rows[f"nnx_{body}_{depth}, jit_partial[alias]"] = phases(
            bound._jitted,
            (model, optimizer, bx, by),
            functools.partial(bound, bx, by),
            bound._bound,
        )
    names = ["call", "flatten", "jitted", "apply", "snapshot"]
    lines = [
        "## Where a call's time goes",
        "",
        f"Produced by `{script_command('call_phases.py', argv)}` (from the repository root): "
        "the median time of each phase of one call on the lean path (`_native.LeanCall`), "
        "timed phase by phase after compilation (module docstring of "
        "`benches/call_phases.py`); microseconds. `call`: a whole call, waited for; "
        "`flatten`: the arguments flattened with identity (for `jit_partial`: the bound ones "
        "checked and joined with the others flattened); `jitted`: JAX's dispatch of the inner "
        "jit and the computation, waited for; `apply`: the plan (results, write-back); "
        "`snapshot`: `jit_partial`'s check of the bound containers (part of its `flatten`).",
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
