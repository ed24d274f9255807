"""strict on flax nnx (rule 12): a step that returns the model and optimizer it updates raises
nothing; one that does not raises a MutationError naming the Variables, never nnx's own
bookkeeping (each module's ``_pytree__state``, a leafless node rebuilt by every unflatten)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")


class Block(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(4, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)

    def __call__(self, x):
        return self.bn(self.linear(x))


class Model(nnx.Module):
    def __init__(self, rngs):
        self.linear_in = Block(rngs)

    def __call__(self, x):
        return self.linear_in(x)


def _setup():
    model = Model(nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
    return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), x


def _train(model, optimizer, x):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return loss


def test_strict_nnx_step_returning_model_and_optimizer_passes():
    model, optimizer, x = _setup()
    kernel = model.linear_in.linear.kernel[...]

    def step(model, optimizer):
        return _train(model, optimizer, x), model, optimizer

    loss, new_model, new_optimizer = tc.jit(step, policy="strict")(model, optimizer)
    assert float(loss) > 0
    assert int(new_optimizer.step[...]) == 1
    assert not jnp.array_equal(new_model.linear_in.linear.kernel[...], kernel)
    # strict behaves as clone for what is returned: the caller's objects are untouched
    assert jnp.array_equal(model.linear_in.linear.kernel[...], kernel)
    assert int(optimizer.step[...]) == 0


def test_strict_nnx_step_not_returning_names_variables_not_bookkeeping():
    model, optimizer, x = _setup()
    with pytest.raises(tc.MutationError) as info:
        tc.jit(lambda model, optimizer: _train(model, optimizer, x), policy="strict")(
            model, optimizer
        )
    message = str(info.value)
    for variable in (
        "model.linear_in.linear.kernel",
        "model.linear_in.linear.bias",
        "model.linear_in.bn.mean",
        "model.linear_in.bn.var",
        "optimizer.step",
    ):
        assert f"  {variable}.value: replaced" in message, message
    assert "_pytree__state" not in message
    assert int(optimizer.step[...]) == 0
