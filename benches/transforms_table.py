"""Measure the eager overhead of treeclone's lifted transformations and write their table.

    python benches/transforms_table.py                  # full run, rewrites the table in the docs
    python benches/transforms_table.py --quick --out /tmp/transforms.md

Each case calls a transformation eagerly (no jit around it, so every call traces the function
again, as ``jax.grad`` called eagerly does): the bare JAX transformation on the functional
form of the step (state in, new state out, written back by the caller), treeclone's under
``alias`` on the stateful form (the function updates its arguments in place), and the model
library's own lifted transformation on its version of the same model (flax nnx's; equinox's,
``eqx.filter_jit`` and ``eqx.filter_value_and_grad``, in the ``eqx_`` rows). Every
contender's results are checked against the bare JAX one before anything is timed.
Contenders are interleaved in rounds, the garbage collector off; the figure is the median
time per call, and each ratio is a contender's median over the bare JAX transformation's.
The Markdown goes between ``<!-- transforms-table:begin -->`` and
``<!-- transforms-table:end -->``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import treeclone as tc
from tree_table import DEFAULT_OUT, INTRO
from treeclone.bench import models as M
from treeclone.bench.timing import (
    BoundCall,
    machine_info,
    measure_cell,
    script_command,
    write_section,
)
from treeclone.bench.workloads import mlp_data, overhead_model_class

BEGIN = "<!-- transforms-table:begin -->"
END = "<!-- transforms-table:end -->"
JAX, ALIAS, NNX = "jax", "treeclone[alias]", "flax.nnx"
LIBRARY = NNX  # the model library's own transformation: nnx's, or equinox's in its rows
SIZES = (32, 64, 64, 10)


def _close(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
        for x, y in zip(la, lb, strict=True)
    )


class Case:
    """One row: what it computes, and per contender a call (``run``) and what to check
    (``result``: the numbers every contender must agree on, after one call on a fresh state)."""

    name = ""
    what = ""

    def contenders(self) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
        raise NotImplementedError


class GradMlp(Case):
    name = "grad_mlp"
    what = "gradient of the mlp_adam MLP's loss (6 parameter leaves, batch 32)"

    def contenders(self):
        from flax import nnx

        params = jax.tree.map(jnp.asarray, M.mlp_init(0, SIZES))
        x, y = (jnp.asarray(a) for a in mlp_data(SIZES, 32))
        model = M.nnx_classes()["MLP"](M.mlp_init(0, SIZES))
        bare = jax.grad(M.mlp_loss)
        ours = tc.grad(M.mlp_loss, policy="alias")
        theirs = nnx.grad(lambda m, x, y: M.cross_entropy(m(x), y))

        # The leaves of each gradient come in the same order (layer by layer, b before w).
        return {
            JAX: (lambda: bare(params, x, y), lambda: bare(params, x, y)),
            ALIAS: (lambda: ours(params, x, y), lambda: ours(params, x, y)),
            NNX: (lambda: theirs(model, x, y), lambda: theirs(model, x, y)),
        }


class ValueAndGradBatchNorm(Case):
    name = "value_and_grad_bn_20"
    what = (
        "loss and gradient of flax's overhead model (20 Blocks of Linear + BatchNorm in "
        "training mode, a Count): the running statistics and the count are updated in place"
    )

    def contenders(self):
        from flax import nnx

        cls = overhead_model_class()
        x = jnp.ones((8, 1))

        def loss(model):
            return jnp.mean(model(x) ** 2)

        bare_model, our_model, their_model = (cls(32, 20, nnx.Rngs(0)) for _ in range(3))
        graphdef, params, rest = nnx.split(bare_model, nnx.Param, ...)

        def functional(params, rest):
            model = nnx.merge(graphdef, params, rest, copy=True)
            return loss(model), nnx.state(model, nnx.Not(nnx.Param))

        bare = jax.value_and_grad(functional, has_aux=True)

        def bare_step():  # the functional form's own write-back: the new statistics
            (value, new_rest), grads = bare(params, rest)
            nnx.update(bare_model, new_rest)
            return value, grads

        # nnx's rule: the Params differentiated, the statistics and the Count carried.
        ours = tc.value_and_grad(loss, policy="alias", wrt=nnx.Param)
        theirs = nnx.value_and_grad(loss)

        def check(value_grads, model):
            value, grads = value_grads
            return [
                value,
                *jax.tree.leaves(grads),
                *jax.tree.leaves(nnx.state(model, nnx.BatchStat)),
            ]

        return {
            JAX: (bare_step, lambda: check(bare_step(), bare_model)),
            ALIAS: (lambda: ours(our_model), lambda: check(ours(our_model), our_model)),
            NNX: (lambda: theirs(their_model), lambda: check(theirs(their_model), their_model)),
        }


class VmapMlp(Case):
    name = "vmap_mlp"
    what = "per-example losses of the mlp_adam MLP: parameters broadcast, batch of 32 mapped"

    def contenders(self):
        from flax import nnx

        params = jax.tree.map(jnp.asarray, M.mlp_init(0, SIZES))
        x, y = (jnp.asarray(a) for a in mlp_data(SIZES, 32))
        model = M.nnx_classes()["MLP"](M.mlp_init(0, SIZES))

        def per_example(params, x, y):
            return M.mlp_loss(params, x[None], y[None])

        bare = jax.vmap(per_example, in_axes=(None, 0, 0))
        ours = tc.vmap(per_example, in_axes=(None, 0, 0), policy="alias")
        theirs = nnx.vmap(
            lambda m, x, y: M.cross_entropy(m(x[None]), y[None]), in_axes=(None, 0, 0)
        )
        return {
            JAX: (lambda: bare(params, x, y), lambda: bare(params, x, y)),
            ALIAS: (lambda: ours(params, x, y), lambda: ours(params, x, y)),
            NNX: (lambda: theirs(model, x, y), lambda: theirs(model, x, y)),
        }


class ScanMlpAdam(Case):
    name = "scan_mlp_adam"
    what = (
        "8 Adam steps of the mlp_adam MLP inside one scan over 8 batches of 32: the stateful "
        "forms update the parameters and the optimizer in place"
    )

    def contenders(self):
        import optax
        from flax import nnx

        tx = optax.adam(1e-3)
        x, y = (jnp.asarray(a) for a in mlp_data(SIZES, 32))
        batches = (jnp.stack([x] * 8), jnp.stack([y] * 8))

        def functional(carry, batch):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(M.mlp_loss)(params, *batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        def in_place(state, batch):
            (state["params"], state["opt_state"]), loss = functional(
                (state["params"], state["opt_state"]), batch
            )
            return state, loss

        def nnx_step(carry, batch):
            model, optimizer = carry
            loss, grads = nnx.value_and_grad(lambda m: M.cross_entropy(m(batch[0]), batch[1]))(
                model
            )
            optimizer.update(model, grads)
            return carry, loss

        def fresh():
            params = jax.tree.map(jnp.asarray, M.mlp_init(0, SIZES))
            return params, tx.init(params)

        params, opt_state = fresh()
        p2, o2 = fresh()
        state = {"params": p2, "opt_state": o2}
        model = M.nnx_classes()["MLP"](M.mlp_init(0, SIZES))
        carry = (model, nnx.Optimizer(model, tx, wrt=nnx.Param))
        theirs = nnx.scan(nnx_step, in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        return {
            JAX: (
                lambda: jax.lax.scan(functional, (params, opt_state), batches),
                lambda: jax.lax.scan(functional, (params, opt_state), batches)[1],
            ),
            ALIAS: (
                lambda: tc.scan(in_place, state, batches, policy="alias"),
                lambda: tc.scan(in_place, state, batches, policy="alias")[1],
            ),
            NNX: (lambda: theirs(carry, batches), lambda: theirs(carry, batches)[1]),
        }


class EquinoxJitStep(Case):
    name = "eqx_jit_mlp_adamw"
    what = (
        "a cached jitted training step (not eager) of an eqx.nn.MLP (3-64-64-2, tanh, batch "
        "32, optax adamw) holding its activation functions as leaves: jax.jit on the arrays "
        "(eqx.partition, the rest a static argument), treeclone.jit(traced='arrays') and "
        "eqx.filter_jit on the whole Module"
    )

    def contenders(self):
        import equinox as eqx
        import optax

        tx = optax.adamw(1e-2)
        model = eqx.nn.MLP(3, 2, 64, 2, activation=jax.nn.tanh, key=jax.random.key(0))
        x = jnp.linspace(-1.0, 1.0, 96).reshape(32, 3)
        y = jnp.sin(x[:, :2])
        params, static = eqx.partition(model, eqx.is_array)

        def step(model, opt_state):
            def loss_fn(m):
                return jnp.mean((jax.vmap(m)(x) - y) ** 2)

            loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
            updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), opt_state, loss

        def functional(params, static, opt_state):
            model, opt_state, loss = step(eqx.combine(params, static), opt_state)
            return eqx.filter(model, eqx.is_array), opt_state, loss

        opt_state = tx.init(params)
        bare = jax.jit(functional, static_argnums=1)
        ours = tc.jit(step, policy="alias", traced="arrays")
        theirs = eqx.filter_jit(step)

        def numbers(out):  # the arrays of the new Module and state, and the loss
            return jax.tree.leaves(eqx.filter(out, eqx.is_array))

        return {
            JAX: (
                lambda: bare(params, static, opt_state),
                lambda: numbers(bare(params, static, opt_state)),
            ),
            ALIAS: (lambda: ours(model, opt_state), lambda: numbers(ours(model, opt_state))),
            LIBRARY: (lambda: theirs(model, opt_state), lambda: numbers(theirs(model, opt_state))),
        }


@functools.cache
def _eqx_net_class() -> type:
    """An equinox Module as equinox's users write one (``examples/equinox_port.py`` without
    the BatchNorm): an ``eqx.nn.MLP`` (3-64-64-2, its activation functions leaves), an output
    function and a name, leaves that are not arrays and that no gradient covers."""
    import equinox as eqx

    class Net(eqx.Module):
        mlp: eqx.nn.MLP
        act: Callable[[Any], Any]
        name: str

        def __init__(self, key: Any):
            self.mlp = eqx.nn.MLP(3, 2, 64, 2, activation=jax.nn.tanh, key=key)
            self.act = jax.nn.softplus
            self.name = "net"

        def __call__(self, x):
            return self.act(self.mlp(x))

    return Net


class EquinoxValueAndGrad(Case):
    name = "eqx_value_and_grad_mlp"
    what = (
        "loss and gradient (eager) of an equinox Module holding an eqx.nn.MLP (3-64-64-2, "
        "tanh, batch 32), an output function and a name: jax.value_and_grad on the floating "
        "arrays (eqx.partition by eqx.is_inexact_array once, the rest an argument), "
        "treeclone.value_and_grad(wrt='arrays') and eqx.filter_value_and_grad on the whole Module"
    )

    def contenders(self):
        import equinox as eqx

        model = _eqx_net_class()(jax.random.key(0))
        x = jnp.linspace(-1.0, 1.0, 96).reshape(32, 3)
        y = jnp.sin(x[:, :2])
        params, static = eqx.partition(model, eqx.is_inexact_array)

        def loss(model, x, y):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)

        def functional(params, static, x, y):
            return loss(eqx.combine(params, static), x, y)

        bare = jax.value_and_grad(functional)
        # equinox's rule: the floating arrays differentiated, the functions and the name static.
        ours = tc.value_and_grad(loss, policy="alias", wrt="arrays")
        theirs = eqx.filter_value_and_grad(loss)

        def check(value_grads):  # the loss and the gradient's leaves (None where not covered)
            value, grads = value_grads
            return [value, *jax.tree.leaves(grads)]

        return {
            JAX: (
                lambda: bare(params, static, x, y),
                lambda: check(bare(params, static, x, y)),
            ),
            ALIAS: (lambda: ours(model, x, y), lambda: check(ours(model, x, y))),
            LIBRARY: (lambda: theirs(model, x, y), lambda: check(theirs(model, x, y))),
        }


CASES: list[type[Case]] = [
    GradMlp,
    ValueAndGradBatchNorm,
    VmapMlp,
    ScanMlpAdam,
    EquinoxJitStep,
    EquinoxValueAndGrad,
]


def _check(case: Case) -> None:
    results = {name: result() for name, (_, result) in case.contenders().items()}
    for name, got in results.items():
        if not _close(got, results[JAX]):
            raise SystemExit(f"{name} disagrees with {JAX} on {case.name}: nothing timed")


def render(results: dict, whats: dict[str, str], info: dict, command: str, rounds: int) -> str:
    names = [JAX, ALIAS, NNX]
    lines = [
        "## Lifted transformations: eager overhead",
        "",
        f"Produced by `{command}` (from the repository root), {rounds} interleaved rounds, "
        "median per call in microseconds, each transformation called eagerly (it traces the "
        "function at every call; the eqx_jit_mlp_adamw row is a cached jitted call); ratio = the "
        "contender's median / the bare JAX transformation's on the functional form (lower is "
        "better). The last column is the model library's own: flax nnx's, equinox's in the "
        "eqx_ rows.",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        "",
        "| case | what | "
        + " | ".join(f"{n if n != NNX else 'nnx / equinox'} µs (ratio)" for n in names)
        + " |",
        "|---|---|" + "--:|" * len(names),
    ]
    for case, cells in results.items():
        base = cells[JAX]["median_us"]
        parts = [
            f"{cells[n]['median_us']:,.0f} ({cells[n]['median_us'] / base:.2f})"
            if n in cells
            else "not applicable"
            for n in names
        ]
        lines.append(f"| {case} | {whats[case]} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds: a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown file to update")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; quick 3)")
    parser.add_argument("--batch-ms", type=float, help="time per batch (default 50; quick 5)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 15)
    batch_ns = int((args.batch_ms or (5 if args.quick else 50)) * 1e6)
    results, whats = {}, {}
    for cls in CASES:
        case = cls()
        _check(case)
        calls = {
            name: BoundCall(lambda run=run: jax.block_until_ready(run()))
            for name, (run, _) in case.contenders().items()
        }
        results[case.name] = measure_cell(calls, rounds, batch_ns)
        whats[case.name] = case.what
        print(case.name, {c: round(r["median_us"], 1) for c, r in results[case.name].items()})
    section = render(
        results, whats, machine_info(), script_command("transforms_table.py", argv), rounds
    )
    write_section(args.out, section, BEGIN, END, intro=INTRO)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
