"""``frozen_half``: fine-tuning with half the parameters frozen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import models as M
from ..contenders import FLOOR, TC_PARTIAL, donated_form
from .base import AGAINST_UNJITTED, INPLACE, NNX_FORMS, Runner, TraceCounter, Workload
from .runners import (
    inplace_form,
    inplace_runner,
    jitted,
    nnx_donation,
    nnx_form,
    nnx_step,
    partial_runner,
)


def merge_halves(frozen: dict[str, Any], trainable: dict[str, Any]) -> dict[str, Any]:
    return {
        "embed": frozen["embed"],
        "layers": list(frozen["layers"]) + list(trainable["layers"]),
        "final_ln": trainable["final_ln"],
    }


class FrozenHalf(Workload):
    name = "frozen_half"
    title = "fine-tuning with half the parameters frozen"
    description = (
        "The transformer of transformer_adam with 8 layers; the embeddings and the first 4 "
        "layers are frozen (66 leaves), the last 4 layers and the final layer norm are "
        "trained with Adam (lr 1e-3; 66 leaves, 133 in Adam's state). The functional step "
        "takes and returns the frozen half unchanged (pass-through leaves)."
    )
    compared = AGAINST_UNJITTED + (
        "of the functional step. `treeclone.jit[alias]` leaves the frozen half alone (neither "
        "mutated nor returned); `flax.nnx.jit` holds it in a non-`Param` variable type that "
        "`nnx.value_and_grad` and `nnx.Optimizer` do not touch."
    )
    n_layers, n_frozen = 8, 4
    d, heads, vocab, seq, batch = 64, 4, 64, 8, 2
    tiny = {"n_layers": 2, "n_frozen": 1}

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        rng = np.random.default_rng(1)
        shape = (self.batch, self.seq)
        self.x = self.put(rng.integers(0, self.vocab, shape).astype(np.int32))
        self.y = self.put(rng.integers(0, self.vocab, shape).astype(np.int32))

    def full_params(self) -> dict[str, Any]:
        return M.transformer_init(0, self.n_layers, self.d, self.vocab, self.seq)

    def halves(self) -> tuple[dict[str, Any], dict[str, Any]]:
        p = self.put(self.full_params())
        k = self.n_frozen
        frozen = {"embed": p["embed"], "layers": p["layers"][:k]}
        trainable = {"layers": p["layers"][k:], "final_ln": p["final_ln"]}
        return frozen, trainable

    def functional(self) -> Callable[..., Any]:
        import optax

        tx, heads = self.tx, self.heads

        def train_step(frozen, trainable, opt_state, x, y):
            def loss_fn(trainable):
                return M.transformer_loss(merge_halves(frozen, trainable), x, y, heads)

            loss, grads = jax.value_and_grad(loss_fn)(trainable)
            updates, opt_state = tx.update(grads, opt_state, trainable)
            return frozen, optax.apply_updates(trainable, updates), opt_state, loss

        return train_step

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step = self.functional()
        frozen, trainable = self.halves()
        opt_state = self.tx.init(trainable)
        losses = []
        for _ in range(n):
            frozen, trainable, opt_state, loss = step(frozen, trainable, opt_state, self.x, self.y)
            losses.append(float(loss))
        return losses

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the parameters, frozen and trained (``model.params()`` of the nnx
        forms). Donated, every form donates the trained half and Adam's state only: the
        in-place step takes the frozen half as an argument of its own (donating it would
        delete the arrays the step leaves alone, as ``jax.jit`` deletes them)."""
        x, y = self.x, self.y
        form, donate = donated_form(contender)
        if form in NNX_FORMS:
            from flax import nnx

            classes = M.nnx_classes()
            model = classes["Transformer"](self.full_params(), self.heads, self.n_frozen)
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_loss(model, x, y):
                return M.cross_entropy(model(x), y)

            donated = nnx_donation(form) if donate else ()
            r = nnx_form(form, jit, nnx_step(nnx_loss), model, optimizer, x, y, donate=donated)
            return r.project(lambda mo: mo[0].params())
        frozen, trainable = self.halves()
        opt_state = self.tx.init(trainable)
        step = self.functional()
        if form in INPLACE and donate and form != FLOOR:
            state = {"trainable": trainable, "opt_state": opt_state}

            def apart(frozen, state, x, y):
                _, state["trainable"], state["opt_state"], loss = step(
                    frozen, state["trainable"], state["opt_state"], x, y
                )
                return loss

            runner = partial_runner if form == TC_PARTIAL else inplace_runner
            r = runner(jit, apart, state, x, y, bound=(frozen,), donate=(1,))
            return r.project(lambda st: merge_halves(frozen, st["trainable"]))
        if form in INPLACE:
            state = {"frozen": frozen, "trainable": trainable, "opt_state": opt_state}

            def inplace(state, x, y):
                _, state["trainable"], state["opt_state"], loss = step(
                    state["frozen"], state["trainable"], state["opt_state"], x, y
                )
                return loss

            r = inplace_form(form, jit, inplace, state, x, y, donate=donate)
            return r.project(lambda st: merge_halves(st["frozen"], st["trainable"]))
        traces = TraceCounter()
        f = jitted(jit, traces.wrap(step), donate=(1, 2) if donate else ())
        fz, tr, o = frozen, trainable, opt_state

        def run(n: int):
            nonlocal fz, tr, o
            a, b, c, loss = fz, tr, o, None
            for _ in range(n):
                a, b, c, loss = f(a, b, c, x, y)
            fz, tr, o = a, b, c
            return loss, (a, b, c)

        return Runner(run=run, traces=traces, state=lambda: merge_halves(fz, tr))
