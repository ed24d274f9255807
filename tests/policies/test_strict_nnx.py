"""strict on flax nnx (rule J14): a step that returns the model and optimizer it updates raises
nothing; one that does not raises a MutationError naming the Variables, never nnx's own
bookkeeping (each module's ``_pytree__state``, a leafless node rebuilt by every unflatten)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

from nnx_models import Block  # noqa: E402 - after the skips


class Model(nnx.Module):
    def __init__(self, rngs):
        self.linear_in = Block(4, 4, rngs=rngs)

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


def test_alias_nnx_step_writes_the_variables_and_nothing_else():
    """Under alias the step updates the caller's Variables in place; every module keeps its
    own bookkeeping objects (``_pytree__state``), which the function only replaced by equal
    ones, and no unchanged Variable is written."""
    model, optimizer, x = _setup()
    plain_model, plain_optimizer, _ = _setup()
    states = {
        id(m): m._pytree__state for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Module)
    }
    variables = {p: v for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)}
    mean = model.linear_in.bn.mean

    def step(model, optimizer):
        return _train(model, optimizer, x)

    jitted = tc.jit(step, policy="alias")
    for _ in range(3):
        loss = jitted(model, optimizer)
        plain_loss = step(plain_model, plain_optimizer)
        assert jnp.allclose(loss, plain_loss, atol=1e-6)
    for _, m in nnx.iter_graph(model):
        if isinstance(m, nnx.Module):
            assert m._pytree__state is states[id(m)]
    assert {p: v for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)} == variables
    assert all(v is variables[p] for p, v in nnx.iter_graph(model) if p in variables)
    assert model.linear_in.bn.mean is mean
    assert int(optimizer.step[...]) == 3
    after, plain = jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(plain_model))
    for a, b in zip(after, plain, strict=True):
        assert jnp.allclose(a, b, atol=1e-6)
