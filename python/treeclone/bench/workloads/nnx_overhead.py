"""flax's own overhead benchmark (``nnx_empty_*``, ``nnx_train_*``): what each wrapper costs
around an nnx model's step."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..contenders import EQX, FLOOR, NNX, NNX_PARTIAL, NNX_TREE, TC_ALIAS, TC_PARTIAL, donated_form
from . import runners
from .base import NotApplicable, Runner, Workload
from .runners import functional_runner, nnx_donation, nnx_form, nnx_runner, state_arrays


@functools.cache
def overhead_model_class() -> type:
    """flax's overhead benchmark model (``benchmarks/nnx_graph_overhead.py`` in google/flax),
    written afresh: ``depth`` Blocks of a Linear (``w``, ``b``) and a BatchNorm, and a
    ``Count`` Variable incremented at every call."""
    import jax.numpy as jnp
    from flax import nnx

    class Linear(nnx.Module):
        def __init__(self, din: int, dout: int, rngs: Any):
            self.w = nnx.Param(jax.random.uniform(rngs.params(), (din, dout)))
            self.b = nnx.Param(jnp.zeros((dout,)))

        def __call__(self, x):
            return x @ self.w[...] + self.b[...]

    class Block(nnx.Module):
        def __init__(self, din: int, dout: int, rngs: Any):
            self.linear = Linear(din, dout, rngs)
            self.bn = nnx.BatchNorm(dout, rngs=rngs)

        def __call__(self, x):
            return nnx.relu(self.bn(self.linear(x)))

    class Count(nnx.Variable):
        pass

    class OverheadMLP(nnx.Module):
        def __init__(self, width: int, depth: int, rngs: Any):
            self.count = Count(jnp.array(0))
            self.linear_in = Block(1, width, rngs)
            self.intermediates = nnx.List([Block(width, width, rngs) for _ in range(depth - 2)])
            self.linear_out = Block(width, 1, rngs)

        def __call__(self, x):
            self.count[...] += 1
            x = nnx.relu(self.linear_in(x))
            for layer in self.intermediates:
                x = nnx.relu(layer(x))
            return self.linear_out(x)

    return OverheadMLP


class NnxOverhead(Workload):
    """flax's own overhead benchmark: what each wrapper costs around an nnx model's step."""

    body = "train"
    depth = 20
    width = 32
    lr = 1e-3
    tiny = {"depth": 3}
    compared = (
        "Each contender's losses over the check steps against eager nnx (no jit) on the "
        "same model; an empty step's loss is 0. Forms: `jax.jit`, `treeclone.jit[clone]` "
        "and `treeclone.jit[strict]` run flax's own functional form (`nnx.split` state in, "
        "`nnx.merge` inside, new state out); `treeclone.jit[alias]` and the nnx wrappers "
        "call `step(model, optimizer, x, y)`, which updates them in place; the jit_partial "
        "contenders bind model and optimizer; `floor` is one jax.jit over the flat arrays."
    )

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        import optax

        super().__init__(device, preserving)
        self.tx = optax.sgd(self.lr)
        rng = np.random.default_rng(0)
        x = np.linspace(0, 1, 100, dtype=np.float32)[:, None]
        y = (0.8 * x**2 + 0.1 + rng.normal(0, 0.1, x.shape)).astype(np.float32)
        self.x, self.y = self.put(x), self.put(y)

    def fresh(self) -> tuple[Any, Any]:
        from flax import nnx

        model = overhead_model_class()(self.width, self.depth, nnx.Rngs(0))
        return model, nnx.Optimizer(model, self.tx, wrt=nnx.Param)

    def step(self) -> Callable[..., Any]:
        """``step(model, optimizer, x, y)``: updates both in place; returns the loss (None for
        the empty body, flax's measure of pure call overhead)."""
        import jax.numpy as jnp
        from flax import nnx

        if self.body == "empty":
            return lambda model, optimizer, x, y: None

        def train_step(model, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
            optimizer.update(model, grads)
            return loss

        return train_step

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step, (model, optimizer) = self.step(), self.fresh()
        return [loss_or_zero(step(model, optimizer, self.x, self.y)) for _ in range(n)]

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the nnx state of ``(model, optimizer)`` (every Variable). Donated: the
        model and the optimizer (``nnx.split``'s state in the functional form)."""
        from flax import nnx

        form, donate = donated_form(contender)
        if form == EQX:
            raise NotApplicable("equinox.filter_jit is not a way to run flax nnx modules")
        step, (model, optimizer) = self.step(), self.fresh()
        x, y = self.x, self.y
        donated = nnx_donation(form) if donate else ()
        if form in (TC_ALIAS, NNX, NNX_TREE):
            r = nnx_runner(jit, step, model, optimizer, x, y, donate=donated)
            r.project(nnx.state)
        elif form in (TC_PARTIAL, NNX_PARTIAL):
            r = nnx_form(NNX_PARTIAL, jit, step, model, optimizer, x, y, donate=donated)
            r.project(nnx.state)
        else:
            graphdef, state = nnx.split((model, optimizer))

            def on_state(state, x, y):
                m, o = nnx.merge(graphdef, state)
                loss = step(m, o, x, y)
                return loss, nnx.split((m, o))[1]

            if form == FLOOR:
                r = runners.floor_runner(jit, on_state, state, x, y, donate=donate)
            else:  # jax.jit, treeclone clone and strict: flax's functional form
                r = functional_runner(
                    jit,
                    lambda g, st, x, y: (g, *on_state(st, x, y)[::-1]),
                    graphdef,
                    state,
                    x,
                    y,
                    arrays=state_arrays,
                    donate=(1,) if donate else (),
                )
                r.project(lambda gs: gs[1])
        run = r.run
        r.run = lambda n: (lambda out: (loss_or_zero(out[0]), out[1]))(run(n))
        return r


def loss_or_zero(loss: Any) -> Any:
    """A step's loss, 0.0 for the empty body's None (what the harness compares)."""
    return 0.0 if loss is None else loss


def overhead_workload(body: str, depth: int) -> type[NnxOverhead]:
    """``NnxOverhead`` with flax's model at ``depth`` and the ``body`` step (``"empty"`` or
    ``"train"``), named ``nnx_<body>_<depth>``."""
    what = {
        "empty": "an empty step: the wrapper's own cost per call (flax's measure)",
        "train": "a training step: forward, `nnx.value_and_grad`, `optimizer.update` (SGD)",
    }[body]
    attrs = {
        "name": f"nnx_{body}_{depth}",
        "title": f"flax's overhead model, depth {depth}, {body} step",
        "description": (
            f"The model of flax's `benchmarks/nnx_graph_overhead.py`: {depth} Blocks "
            "(`Linear` + `nnx.BatchNorm`, width 32) and a `Count` Variable incremented at "
            f"every call, with `nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)`; {what}."
        ),
        "body": body,
        "depth": depth,
    }
    return type(f"Nnx{body.title()}{depth}", (NnxOverhead,), attrs)
