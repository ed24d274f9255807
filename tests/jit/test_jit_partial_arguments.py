"""``jit_partial``'s unbound arguments (docs/semantics.md, "jit_partial"): by default the bound
arguments are ``alias`` and the call's own ``clone``, so a step that changes its batch in place
never rewrites the caller's batch without a word (a MutationWarning), as ``nnx.jit_partial``
propagates only what it binds; the bound state is still updated. A policy, or a dict, says
otherwise. Compared with ``nnx.jit_partial`` and with ``treeclone.jit`` under each policy."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

EPOCHS = 3


def _model_and_optimizer() -> tuple[Any, Any]:
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)


def _step(model: Any, optimizer: Any, batch: dict) -> jax.Array:
    batch["x"] = batch["x"] / 255  # preprocessing in place, as a data pipeline might
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(batch["x"]) - batch["y"]) ** 2))(model)
    optimizer.update(model, grads)
    return loss


def _batch() -> dict:
    return {"x": jnp.arange(12.0).reshape(4, 3) * 20, "y": jnp.ones((4, 2))}


def _epochs(step: Any, batch: dict) -> list[float]:
    return [float(step(batch)) for _ in range(EPOCHS)]


# The policies under which the caller's batch is left as it was: the default, and a dict that
# names only the bound arguments (the others are clone).
KEEPING = [None, {"model": "alias", "optimizer": "alias"}, {0: "alias"}, {"batch": "clone"}]


@pytest.mark.parametrize("policy", KEEPING, ids=["default", "names", "a-position", "the-batch"])
def test_the_batch_is_left_alone_and_the_bound_state_updated_as_nnx_jit_partial(policy: Any):
    theirs = _model_and_optimizer()
    their_batch = _batch()
    their_losses = _epochs(nnx.jit_partial(_step, *theirs, graph=False), their_batch)

    mine = _model_and_optimizer()
    batch = _batch()
    kwargs = {} if policy is None else {"policy": policy}
    step = tc.jit_partial(_step, *mine, **kwargs)
    with pytest.warns(tc.MutationWarning, match=r"batch\['x'\]"):
        losses = _epochs(step, batch)

    np.testing.assert_allclose(losses, their_losses, rtol=1e-6)
    np.testing.assert_array_equal(batch["x"], _batch()["x"])  # never rewritten
    np.testing.assert_array_equal(their_batch["x"], batch["x"])
    trained = zip(jax.tree.leaves(nnx.state(mine)), jax.tree.leaves(nnx.state(theirs)), strict=True)
    for got, want in trained:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # the bound state trained
    assert int(mine[1].step[...]) == EPOCHS


def test_the_default_is_jit_with_the_bound_arguments_alias_and_the_others_clone():
    mine, theirs = _model_and_optimizer(), _model_and_optimizer()
    batch, their_batch = _batch(), _batch()
    step = tc.jit_partial(_step, *mine)
    # The others are clone by the dict's default, not by a ``...`` (rule P5).
    jitted = tc.jit(_step, policy={"model": "alias", "optimizer": "alias"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        np.testing.assert_allclose(
            _epochs(step, batch), [float(jitted(*theirs, their_batch)) for _ in range(EPOCHS)]
        )
    assert step.policy == jitted.policy


def test_an_explicit_policy_applies_to_every_argument_as_under_jit():
    """``policy="alias"`` asks for plain Python on every argument: the batch is rewritten at
    each call, as ``treeclone.jit(step, policy="alias")`` rewrites it; ``strict`` refuses the
    unreturned change, naming it; ``...`` in a dict names the others."""
    for policy in ("alias", {"batch": "alias", ...: "alias"}):
        mine, batch = _model_and_optimizer(), _batch()
        reference, their_batch = _model_and_optimizer(), _batch()
        jitted = tc.jit(_step, policy="alias")
        np.testing.assert_allclose(
            _epochs(tc.jit_partial(_step, *mine, policy=policy), batch),
            [float(jitted(*reference, their_batch)) for _ in range(EPOCHS)],
            rtol=1e-6,
        )
        np.testing.assert_allclose(batch["x"], _batch()["x"] / 255**EPOCHS, rtol=1e-6)
        np.testing.assert_allclose(their_batch["x"], batch["x"])
    with pytest.raises(tc.MutationError, match=r"batch\['x'\]: replaced"):
        tc.jit_partial(_step, *_model_and_optimizer(), policy="strict")(_batch())
    with pytest.raises(ValueError, match="preserves identity"):
        tc.jit_partial(_step, *_model_and_optimizer(), policy="clone")


def test_a_bound_argument_named_in_the_dict_keeps_its_policy():
    def step(state: dict, log: list, x: jax.Array) -> jax.Array:
        state["n"] = state["n"] + 1
        log.append(x)
        return state["n"]

    state, log = {"n": jnp.zeros(())}, []
    p = tc.jit_partial(step, state, log, policy={"log": "clone"})
    with pytest.warns(tc.MutationWarning, match=r"log"):
        p(jnp.ones(()))
    p(jnp.ones(()))
    assert float(state["n"]) == 2.0 and log == []  # state alias (unnamed, bound), log clone
