"""The workloads of a model given by ``loss_fn(params, x, y)`` and its nnx version, trained
with Adam: ``mlp_adam`` and ``transformer_adam``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import models as M
from ..contenders import donated_form
from .base import INPLACE, NNX_FORMS, Runner, Workload
from .runners import (
    functional_runner,
    functional_step,
    inplace_form,
    inplace_step,
    nnx_donation,
    nnx_form,
    nnx_step,
    unjitted_losses,
)


class ParamsWorkload(Workload):
    """A model given by ``loss_fn(params, x, y)`` and an nnx version, trained with Adam."""

    def params0(self) -> Any:
        raise NotImplementedError

    def loss_fn(self, params, x, y):
        raise NotImplementedError

    def nnx_model(self, classes: dict[str, Any], params: Any) -> Any:
        raise NotImplementedError

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        self.x, self.y = (self.put(a) for a in self.data())

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step = functional_step(self.loss_fn, self.tx)
        params = self.put(self.params0())
        opt_state = self.tx.init(params)
        return unjitted_losses(step, params, opt_state, self.x, self.y, n)[0]

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the parameters (``model.params()`` of the nnx forms)."""
        form, donate = donated_form(contender)
        if form in NNX_FORMS:
            from flax import nnx

            model = self.nnx_model(M.nnx_classes(), self.params0())
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_loss(model, x, y):
                return M.cross_entropy(model(x), y)

            step = nnx_step(nnx_loss)
            donated = nnx_donation(form) if donate else ()
            r = nnx_form(form, jit, step, model, optimizer, self.x, self.y, donate=donated)
            return r.project(lambda mo: mo[0].params())
        params = self.put(self.params0())
        opt_state = self.tx.init(params)
        if form in INPLACE:
            state = {"params": params, "opt_state": opt_state}
            fn = inplace_step(self.loss_fn, self.tx)
            r = inplace_form(form, jit, fn, state, self.x, self.y, donate=donate)
            return r.project(lambda st: st["params"])
        fn = functional_step(self.loss_fn, self.tx)
        donated = (0, 1) if donate else ()
        r = functional_runner(jit, fn, params, opt_state, self.x, self.y, donate=donated)
        return r.project(lambda po: po[0])


class MlpAdam(ParamsWorkload):
    name = "mlp_adam"
    title = "3-layer MLP, Adam (dispatch-bound)"
    description = (
        "MLP 32->64->64->10 (ReLU, softmax cross-entropy), batch 32, optax Adam (lr 1e-3); "
        "6 parameter leaves, 13 more in Adam's state. Tiny: the time is mostly dispatch."
    )
    sizes = (32, 64, 64, 10)
    batch = 32

    def params0(self):
        return M.mlp_init(0, self.sizes)

    def loss_fn(self, params, x, y):
        return M.mlp_loss(params, x, y)

    def nnx_model(self, classes, params):
        return classes["MLP"](params)

    def data(self):
        return mlp_data(self.sizes, self.batch)


def mlp_data(sizes: tuple[int, ...], batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int32)
    return x, y


class MlpDataWorkload(Workload):
    """A workload with a step of its own on mlp_adam's MLP sizes and data (``x``, ``y``)."""

    sizes, batch = MlpAdam.sizes, MlpAdam.batch

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        self.x, self.y = (self.put(a) for a in mlp_data(self.sizes, self.batch))


class TransformerAdam(ParamsWorkload):
    name = "transformer_adam"
    title = "12-layer transformer, Adam"
    description = (
        "12 pre-LN transformer blocks (d_model 64, 4 heads, causal attention, GELU MLP 256), "
        "token + position embeddings, unembedding by the token embedding; batch 2 x 8 "
        "tokens, vocabulary 64, next-token cross-entropy, optax Adam (lr 1e-3). "
        "196 parameter leaves, 589 with Adam's state."
    )
    n_layers, d, heads, vocab, seq, batch = 12, 64, 4, 64, 8, 2
    tiny = {"n_layers": 2}

    def params0(self):
        return M.transformer_init(0, self.n_layers, self.d, self.vocab, self.seq)

    def loss_fn(self, params, x, y):
        return M.transformer_loss(params, x, y, self.heads)

    def nnx_model(self, classes, params):
        return classes["Transformer"](params, self.heads)

    def data(self):
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, self.vocab, (self.batch, self.seq)).astype(np.int32)
        labels = rng.integers(0, self.vocab, (self.batch, self.seq)).astype(np.int32)
        return tokens, labels
