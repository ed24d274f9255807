"""``seed_pattern``: an optimizer mutated in place and returned, under every jit wrapper."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import models as M
from ..contenders import FLOOR, NNX, NNX_PARTIAL, NNX_TREE, TC_PARTIAL
from .base import AGAINST_UNJITTED, NotApplicable, Runner, TraceCounter
from .params import MlpDataWorkload
from .runners import nnx_arrays


@dataclasses.dataclass
class Optimizer:
    """An optax optimizer as a mutable pytree node: ``update`` changes it in place.

    The pattern of the seed discussion: ``params = optimizer.update(grads, params)`` inside
    a jitted ``train_step`` that returns the optimizer.
    """

    tx: Any
    opt_state: Any
    count: Any

    def update(self, grads: Any, params: Any) -> Any:
        import optax

        updates, self.opt_state = self.tx.update(grads, self.opt_state, params)
        self.count = self.count + 1
        return optax.apply_updates(params, updates)


jax.tree_util.register_dataclass(Optimizer, data_fields=["opt_state", "count"], meta_fields=["tx"])


def seed_train_step(model, x, y, optimizer):
    loss, grads = jax.value_and_grad(M.mlp_loss)(model, x, y)
    model = optimizer.update(grads, model)
    return model, loss, optimizer


class SeedPattern(MlpDataWorkload):
    name = "seed_pattern"
    title = "the seed pattern: an optimizer mutated in place and returned"
    description = (
        "`train_step(model, x, y, optimizer)` on the MLP of mlp_adam: `optimizer` is a "
        "dataclass registered with `jax.tree_util.register_dataclass` (optax Adam state and "
        "a step count), mutated in place by `optimizer.update(grads, model)` and returned "
        "with the model and the loss. The same function runs under every jit wrapper; "
        "flax.nnx.jit runs the nnx version (`nnx.Optimizer.update`, in place, loss returned)."
    )
    compared = AGAINST_UNJITTED + (
        "of the same `train_step` (where the mutation hits the caller's optimizer). The "
        "notes say whether the optimizer a call returns is the object that was passed in."
    )

    def fresh(self) -> tuple[Any, Optimizer]:
        model = self.put(M.mlp_init(0, self.sizes))
        count = self.put(np.zeros((), np.int32))
        return model, Optimizer(self.tx, self.tx.init(model), count)

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        model, optimizer = self.fresh()
        losses = []
        for _ in range(n):
            model, loss, optimizer = seed_train_step(model, self.x, self.y, optimizer)
            losses.append(float(loss))
        assert int(optimizer.count) == n
        return losses

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        x, y = self.x, self.y
        if contender in (FLOOR, TC_PARTIAL, NNX_PARTIAL):
            raise NotApplicable(
                "the seed's step is called as step(model, x, y, optimizer) and returns the "
                "optimizer: the pattern under test, not a state to bind or flatten"
            )
        if contender in (NNX, NNX_TREE):
            from flax import nnx

            model = M.nnx_classes()["MLP"](M.mlp_init(0, self.sizes))
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_train_step(model, x, y, optimizer):
                def loss_fn(model):
                    return M.cross_entropy(model(x), y)

                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss

            traces = TraceCounter()
            f = jit(traces.wrap(nnx_train_step))

            def run_nnx(n: int):
                loss = None
                for _ in range(n):
                    loss = f(model, x, y, optimizer)
                return loss, (model, optimizer)

            return Runner(
                run=run_nnx,
                traces=traces,
                arrays=nnx_arrays(model, optimizer),
                state=model.params,
            )

        model, optimizer = self.fresh()
        traces = TraceCounter()
        f = jit(traces.wrap(seed_train_step))
        passed = optimizer
        state = {"model": model, "optimizer": optimizer, "first": True}
        notes: list[str] = []

        def run(n: int):
            m, o, loss = state["model"], state["optimizer"], None
            for _ in range(n):
                m, loss, o = f(m, x, y, o)
            if n and state["first"]:
                state["first"] = False
                same = o is passed
                count = int(np.asarray(passed.count))
                notes.append(
                    "the optimizer returned by the first call "
                    + ("is the object passed in" if same else "is a new object")
                    + f"; the passed object's count after it: {count}"
                )
            state["model"], state["optimizer"] = m, o
            return loss, (m, o)

        return Runner(run=run, traces=traces, notes=notes, state=lambda: state["model"])
