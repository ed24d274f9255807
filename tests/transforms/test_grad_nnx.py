"""flax nnx and equinox models through ``treeclone.value_and_grad`` / ``grad``: a loss that
updates BatchNorm running statistics while it is differentiated gives, under ``alias``, the
loss, the Params' gradients and the updated statistics (on the caller's model) that
``nnx.value_and_grad`` gives on a copy of the model; ``strict`` names the statistics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")

from nnx_models import Headed  # noqa: E402 - after the skip


def _model() -> Headed:
    return Headed(4, 4, 1, rngs=nnx.Rngs(0))


def loss_fn(model, x):
    return jnp.mean(model(x) ** 2)


X = jax.random.normal(jax.random.PRNGKey(1), (8, 4))


def _leaves(state):
    return jax.tree.leaves(state)


def test_alias_value_and_grad_equals_nnx_value_and_grad_with_batch_stats():
    model, reference = _model(), _model()
    bn_mean = model.block.bn.mean  # the caller's Variable object
    for _ in range(2):
        loss, grads = tc.value_and_grad(loss_fn, policy="alias")(model, X)
        ref_loss, ref_grads = nnx.value_and_grad(loss_fn)(reference, X)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
        # treeclone's gradient has JAX's structure of the argument: the model pytree, whose
        # Params hold the gradients nnx gives as a State of the Params
        ours = nnx.state(grads, nnx.Param)
        assert jax.tree.structure(ours) == jax.tree.structure(ref_grads)
        for a, b in zip(_leaves(ours), _leaves(ref_grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        # the running statistics were updated on the caller's model, as nnx updates its own
        for a, b in zip(
            _leaves(nnx.state(model, nnx.BatchStat)),
            _leaves(nnx.state(reference, nnx.BatchStat)),
            strict=True,
        ):
            assert not isinstance(a, jax.core.Tracer)
            np.testing.assert_allclose(a, b, rtol=1e-6)
    assert model.block.bn.mean is bn_mean
    assert not np.allclose(bn_mean[...], 0.0)


def test_strict_names_the_running_statistics_updated_and_not_returned():
    model = _model()
    mean = np.asarray(model.block.bn.mean[...])
    with pytest.raises(tc.MutationError) as info:
        tc.grad(loss_fn, policy="strict")(model, X)
    message = str(info.value)
    assert "model.block.bn.mean" in message and "_pytree__state" not in message
    np.testing.assert_array_equal(model.block.bn.mean[...], mean)

    def returns_model(model, x):
        return loss_fn(model, x), model

    grads, new_model = tc.grad(returns_model, has_aux=True, policy="strict")(model, X)
    assert not np.allclose(new_model.block.bn.mean[...], mean)
    np.testing.assert_array_equal(model.block.bn.mean[...], mean)


def test_equinox_module_grad_equals_filter_grad_on_its_arrays():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(mlp, eqx.is_inexact_array)
    x = jnp.ones(3)

    def loss(params, static):
        return jnp.sum(eqx.combine(params, static)(x) ** 2)

    ours = tc.grad(loss, policy="alias")(params, static)
    theirs = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(mlp)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
