"""The seams of issue 21 that are rules of use rather than code: JAX's own transformations
inside an alias step (case 6) and what "shared references stay shared" means for a step that
computes each position anew. Each is checked against nnx's or plain Python's result
(docs/semantics.md, "JAX's own transformations inside an alias step" and rule J8)."""

from __future__ import annotations

import copy
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeclone as tc
from flax import nnx
from nnx_models import Block


def _block() -> Block:
    return Block(3, 3, rngs=nnx.Rngs(0), use_running_average=False)


_X = jnp.arange(12.0).reshape(4, 3) / 7


def _mean(block: Block) -> np.ndarray:
    return np.asarray(block.bn.mean[...])


def test_jax_checkpoint_inside_an_alias_step_drops_state_and_treeclones_keeps_it() -> None:
    # Case 6: a step that rematerializes its block. nnx's own step is the reference.
    def step_with(remat: Any) -> Any:
        def step(block: Block, x: jax.Array) -> jax.Array:
            return remat(lambda b, x: b(x))(block, x).sum()

        return step

    reference = _block()
    nnx.jit(step_with(nnx.remat))(reference, _X)
    assert np.abs(_mean(reference)).sum() > 0  # the statistics moved

    # jax.checkpoint hands the function copies of the block and keeps only what it returns:
    # the statistics stay at 0, as under nnx.jit with jax.checkpoint (JAX's behaviour).
    dropped, dropped_nnx = _block(), _block()
    tc.jit(step_with(jax.checkpoint), policy="alias")(dropped, _X)
    nnx.jit(step_with(jax.checkpoint))(dropped_nnx, _X)
    np.testing.assert_array_equal(_mean(dropped), 0.0)
    np.testing.assert_array_equal(_mean(dropped_nnx), 0.0)

    # treeclone.checkpoint under alias (and nnx.remat) keep them: nnx's own values.
    for remat in (lambda f: tc.checkpoint(f, policy="alias"), nnx.remat):
        kept = _block()
        tc.jit(step_with(remat), policy="alias")(kept, _X)
        np.testing.assert_allclose(_mean(kept), _mean(reference), rtol=1e-6)


def _tied_params() -> dict[str, Any]:
    table = jnp.arange(6.0).reshape(3, 2) / 10
    return {"embed": table, "unembed": table}


def _loss(params: dict, x: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(x @ params["embed"].T) @ params["unembed"])


def test_a_tie_holds_only_where_the_step_keeps_it_as_in_plain_python() -> None:
    tx = optax.sgd(0.1)
    x = jnp.ones((2, 2))

    def untying_step(state: dict) -> None:
        # optax.apply_updates computes each position anew: two arrays, as in plain Python.
        grads = jax.grad(_loss)(state["params"], x)
        updates, state["opt"] = tx.update(grads, state["opt"])
        state["params"] = optax.apply_updates(state["params"], updates)

    def tying_step(state: dict) -> None:
        # The tie kept: one gradient for the shared table, one new array at both places.
        grads = jax.grad(_loss)(state["params"], x)
        g = grads["embed"] + grads["unembed"]
        new = state["params"]["embed"] - 0.1 * g
        state["params"]["embed"] = state["params"]["unembed"] = new

    for step, tied_after in ((untying_step, False), (tying_step, True)):
        params = _tied_params()
        ours = {"params": params, "opt": tx.init(params)}
        plain = copy.deepcopy(ours)
        plain["params"]["unembed"] = plain["params"]["embed"]  # deepcopy keeps the tie too
        aliased = tc.jit(step, policy="alias")
        for _ in range(2):
            aliased(ours)
            step(plain)
        for name in ("embed", "unembed"):
            np.testing.assert_allclose(ours["params"][name], plain["params"][name], rtol=1e-6)
        assert (ours["params"]["embed"] is ours["params"]["unembed"]) is tied_after
        assert (plain["params"]["embed"] is plain["params"]["unembed"]) is tied_after
