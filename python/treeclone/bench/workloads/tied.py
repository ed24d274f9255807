"""``tied_embeddings``: one array object in two places of the parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import models as M
from ..contenders import FLOOR
from .base import INPLACE, NNX_FORMS, TIED, UNTIED, NotApplicable, Runner, Workload
from .runners import functional_runner, inplace_form, nnx_form, nnx_step, unjitted_losses


def tied_step(tx: Any) -> Callable[..., Any]:
    """The functional step of the tied model, aware of the tie by object identity.

    When ``params['unembed'] is params['embed']`` (the tie is visible in the function), the
    two uses form one parameter: its gradient is the sum over both places, it gets one
    update, and the result is put back in both places, so the tie survives the step. When
    they are two objects (as every leaf is under ``jax.jit``, which traces each position as
    its own input), each place is a parameter of its own and they drift apart.
    """
    import optax

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(M.tied_loss)(params, x, y)
        tied = params["unembed"] is params["embed"]
        if tied:
            g = grads["embed"] + grads["unembed"]
            grads = {**grads, "embed": g, "unembed": g}
        updates, opt_state = tx.update(grads, opt_state, params)
        new = optax.apply_updates(params, updates)
        if tied:
            new = {**new, "unembed": new["embed"]}
        return new, opt_state, loss

    return train_step


class TiedEmbeddings(Workload):
    name = "tied_embeddings"
    title = "tied embeddings (one array object in two places)"
    description = (
        "Embedding (vocabulary 256, d 64) -> tanh dense -> logits by the unembedding; "
        "params['embed'] and params['unembed'] are the same array object. Batch 64 tokens, "
        "next-token cross-entropy, Adam (lr 1e-2). The step is written against the tie: "
        "when the two entries are one object it sums their gradients and keeps them one "
        "object."
    )
    compared = (
        "Two semantics, each against its own plain-Python (un-jitted) run of the same step. "
        "*tied*: the un-jitted step on the tied parameters (the tie is one parameter, its "
        "gradient summed over both uses), expected of the contenders that keep shared "
        "objects shared: the treeclone policies whose identity axis is `preserve` (`alias`, "
        "`strict`) and `flax.nnx.jit` (the same `nnx.Param` in both places). *untied*: the "
        "un-jitted step on parameters whose two entries are separate copies, which is what "
        "`jax.jit` computes (it traces each position as its own input, so the tie is broken "
        "from the first step on); expected of `jax.jit`, `treeclone.jit[clone]` and "
        "`equinox.filter_jit`. Besides the losses, a contender passes only if its final "
        "`embed` and `unembed` are equal (tied) or differ (untied)."
    )
    lr = 1e-2
    vocab, d, batch = 256, 64, 64

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        rng = np.random.default_rng(1)
        self.x = self.put(rng.integers(0, self.vocab, self.batch).astype(np.int32))
        self.y = self.put(rng.integers(0, self.vocab, self.batch).astype(np.int32))

    def params0(self, tied: bool = True) -> dict[str, Any]:
        p = M.tied_init(0, self.vocab, self.d)
        embed = self.put(p["embed"])
        # device_put maps over leaves, which would untie the two entries: put E once.
        unembed = embed if tied else self.put(p["unembed"].copy())
        return {"embed": embed, "hidden": self.put(p["hidden"]), "unembed": unembed}

    def semantics(self, contender: str) -> str:
        return TIED if contender in self.preserving else UNTIED

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step = tied_step(self.tx)
        params = self.params0(tied=semantics == TIED)
        opt_state = self.tx.init(params)
        losses, params = unjitted_losses(step, params, opt_state, self.x, self.y, n)
        if semantics == TIED:
            assert params["unembed"] is params["embed"], "reference lost its tie"
        return losses

    @staticmethod
    def _tie_check(
        semantics: str, notes: list[str], get: Callable[[], tuple[Any, Any, bool, str]]
    ) -> Callable[[], Any]:
        def verify() -> str | None:
            embed, unembed, same, what = get()
            notes.append(f"after the check steps, `{what}`: {same}")
            equal = np.array_equal(np.asarray(embed), np.asarray(unembed))
            if semantics == TIED and not equal:
                return "embed and unembed differ after training: the tie was not kept"
            if semantics == UNTIED and equal:
                return "embed and unembed are still equal: expected the tie to be broken"
            return None

        return verify

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        sem = self.semantics(contender)
        if contender == FLOOR:
            raise NotApplicable("a flat list of arrays cannot hold the tie (one object twice)")
        if contender in NNX_FORMS:
            from flax import nnx

            model = M.nnx_classes()["Tied"](M.tied_init(0, self.vocab, self.d))
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_loss(model, x, y):
                return M.cross_entropy(model(x), y)

            step = nnx_step(nnx_loss)
            r = nnx_form(contender, jit, step, model, optimizer, self.x, self.y)
            r.project(lambda mo: mo[0].params())
            r.semantics = sem
            r.verify = self._tie_check(
                sem,
                r.notes,
                lambda: (
                    model.embed[...],
                    model.unembed[...],
                    model.unembed is model.embed,
                    "model.unembed is model.embed",
                ),
            )
            return r
        params = self.params0(tied=True)
        opt_state = self.tx.init(params)
        fn = tied_step(self.tx)
        if contender in INPLACE:
            state = {"params": params, "opt_state": opt_state}

            def inplace(state, x, y):
                new, state["opt_state"], loss = fn(state["params"], state["opt_state"], x, y)
                state["params"] = new
                return loss

            r = inplace_form(contender, jit, inplace, state, self.x, self.y, semantics=sem)
            r.project(lambda st: st["params"])
            get = lambda: state["params"]  # noqa: E731
        else:
            r = functional_runner(jit, fn, params, opt_state, self.x, self.y, semantics=sem)
            r.project(lambda po: po[0])
            get = lambda: r.run(0)[1][0]  # noqa: E731  (run(0): the current state, no step)

        def tie() -> tuple[Any, Any, bool, str]:
            p = get()
            return p["embed"], p["unembed"], p["unembed"] is p["embed"], "unembed is embed"

        r.verify = self._tie_check(sem, r.notes, tie)
        return r
