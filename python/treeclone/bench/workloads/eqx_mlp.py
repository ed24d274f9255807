"""``eqx_mlp_adam`` (the ``equinox`` group): an equinox Module with a function field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .. import models as M
from ..contenders import (
    BASELINE,
    EQUINOX,
    EQX,
    FLOOR,
    TC_ALIAS,
    TC_ALIAS_PARTITIONED,
    TC_ALIAS_TRACED,
    TC_CLONE_TRACED,
    TC_PARTIAL,
    TC_PARTIAL_TRACED,
)
from .base import AGAINST_UNJITTED, NotApplicable, Runner
from .params import MlpDataWorkload
from .runners import functional_runner, inplace_form, unjitted_losses


class EqxMlpAdam(MlpDataWorkload):
    name = "eqx_mlp_adam"
    group = EQUINOX
    title = "an equinox MLP with a function field, Adam"
    description = (
        "The MLP of mlp_adam (32->64->64->10, batch 32, optax Adam lr 1e-3) as an equinox "
        "Module whose activation (`jax.nn.relu`) is a field: a leaf that is not an array. "
        "`equinox.filter_jit` and `treeclone.jit[clone,traced=arrays]` run the functional "
        "step `(model, opt_state, x, y) -> (model, opt_state, loss)` "
        "(`eqx.filter_value_and_grad`, `eqx.apply_updates`); "
        "`treeclone.jit[alias,traced=arrays]` and `treeclone.jit_partial[alias,traced=arrays]` "
        "(the state bound) an in-place step that assigns the new model and optimizer state "
        "into a `{'model', 'opt_state'}` dict; `jax.jit` (functional), the floor and "
        "`treeclone.jit[alias,partitioned]` (in place) the same step over "
        "`eqx.partition(model, eqx.is_array)`'s arrays, the rest (the activation) closed over "
        "and combined inside."
    )
    compared = AGAINST_UNJITTED + (
        "of the functional step, and its final arrays (the model's and Adam's state) against "
        "`jax.jit`'s."
    )

    def fresh(self) -> tuple[Any, Any]:
        import equinox as eqx

        p = self.put(M.mlp_init(0, self.sizes))
        layers = tuple(p[f"layer{i}"] for i in range(len(p)))
        model = M.eqx_mlp_class()(layers, jax.nn.relu)
        return model, self.tx.init(eqx.filter(model, eqx.is_array))

    def step(self) -> Callable[..., Any]:
        import equinox as eqx

        tx = self.tx

        def loss_fn(model, x, y):
            return M.cross_entropy(model(x), y)

        def train_step(model, opt_state, x, y):
            loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
            updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), opt_state, loss

        return train_step

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step, (model, opt_state) = self.step(), self.fresh()
        return unjitted_losses(step, model, opt_state, self.x, self.y, n)[0]

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the model's arrays (``eqx.filter(model, eqx.is_array)``) and Adam's
        state."""
        import equinox as eqx

        step, (model, opt_state) = self.step(), self.fresh()
        x, y = self.x, self.y

        def arrays(model: Any) -> Any:
            return eqx.filter(model, eqx.is_array)

        if contender in (EQX, TC_CLONE_TRACED):
            r = functional_runner(jit, step, model, opt_state, x, y)
            return r.project(lambda mo: (arrays(mo[0]), mo[1]))
        if contender in (TC_ALIAS_TRACED, TC_PARTIAL_TRACED):
            state = {"model": model, "opt_state": opt_state}
            form = TC_PARTIAL if contender == TC_PARTIAL_TRACED else TC_ALIAS
            r = inplace_form(form, jit, _in_place(step, "model"), state, x, y)
            return r.project(lambda st: (arrays(st["model"]), st["opt_state"]))
        if contender not in (BASELINE, FLOOR, TC_ALIAS_PARTITIONED):
            raise NotApplicable(f"{contender} is not one of this workload's forms")
        params, static = eqx.partition(model, eqx.is_array)

        def on_arrays(params, opt_state, x, y):
            model, opt_state, loss = step(eqx.combine(params, static), opt_state, x, y)
            return arrays(model), opt_state, loss

        if contender == BASELINE:
            return functional_runner(jit, on_arrays, params, opt_state, x, y)
        state = {"params": params, "opt_state": opt_state}
        form = FLOOR if contender == FLOOR else TC_ALIAS
        r = inplace_form(form, jit, _in_place(on_arrays, "params"), state, x, y)
        return r.project(lambda st: (st["params"], st["opt_state"]))


def _in_place(step: Callable[..., Any], key: str) -> Callable[..., Any]:
    """``step(arrays, opt_state, x, y) -> (arrays, opt_state, loss)`` as the in-place step
    of the in-place forms: ``state[key]`` and ``state["opt_state"]`` replaced, the loss
    returned. One for the whole model and for its arrays alone (``key`` names which)."""

    def inplace(state, x, y):
        state[key], state["opt_state"], loss = step(state[key], state["opt_state"], x, y)
        return loss

    return inplace
