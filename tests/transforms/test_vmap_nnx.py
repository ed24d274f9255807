"""flax nnx models through ``treeclone.vmap`` against ``nnx.vmap`` on a copy of the same model
(same results, same caller state):

* an ensemble built with ``nnx.split_rngs`` + ``nnx.vmap`` (a stacked model), each member
  counting its calls and keeping its last output in Variables: ``in_axes=(0, 0)`` updates the
  members' state along the ensemble axis;
* one model broadcast over the batch (``in_axes=(None, 0)``) whose BatchNorm averages its
  statistics over the vmapped axis (``axis_name``): the new statistics are the same for every
  example and are written once into the caller's Variables; without ``axis_name`` they would
  differ per example, which is the key-path error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")

E = 4  # ensemble members


class Count(nnx.Variable):
    pass


class Member(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(3, 2, rngs=rngs)
        self.calls = Count(jnp.zeros(()))
        self.last = Count(jnp.zeros(2))

    def __call__(self, x):
        self.calls[...] = self.calls[...] + 1
        y = self.linear(x)
        self.last[...] = y.mean(0)
        return y


@nnx.split_rngs(splits=E)
@nnx.vmap(in_axes=(0,), out_axes=0)
def make_ensemble(rngs):
    return Member(rngs)


def apply(model, x):
    return model(x)


def _state_leaves(model, kind=nnx.Variable):
    return jax.tree.leaves(nnx.state(model, kind))


def test_alias_ensemble_equals_nnx_vmap():
    ours, theirs = make_ensemble(nnx.Rngs(0)), make_ensemble(nnx.Rngs(0))
    calls, kernel = ours.calls, ours.linear.kernel  # the caller's Variable objects
    x = jax.random.normal(jax.random.PRNGKey(1), (E, 5, 3))
    for _ in range(2):
        got = tc.vmap(apply, in_axes=(0, 0), policy="alias")(ours, x)
        want = nnx.vmap(apply, in_axes=(0, 0))(theirs, x)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        for a, b in zip(_state_leaves(ours), _state_leaves(theirs), strict=True):
            assert not isinstance(a, jax.core.Tracer)
            np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_array_equal(ours.calls[...], np.full(E, 2.0))
    assert ours.last[...].shape == (E, 2)  # per-member state keeps its ensemble axis
    assert ours.calls is calls and ours.linear.kernel is kernel


def test_strict_names_the_members_state_updated_and_not_returned():
    model = make_ensemble(nnx.Rngs(0))
    x = jnp.ones((E, 5, 3))
    with pytest.raises(tc.MutationError) as info:
        tc.vmap(apply, in_axes=(0, 0), policy="strict")(model, x)
    message = str(info.value)
    assert "model.calls.value: replaced" in message and "model.last.value" in message
    assert "_pytree__state" not in message
    np.testing.assert_array_equal(model.calls[...], np.zeros(E))


class Net(nnx.Module):
    def __init__(self, rngs, axis_name):
        self.linear = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, axis_name=axis_name, rngs=rngs)

    def __call__(self, x):
        return self.bn(self.linear(x[None]))[0]


def test_alias_broadcast_model_with_batchnorm_over_the_vmapped_axis_equals_nnx_vmap():
    ours, theirs = Net(nnx.Rngs(0), "batch"), Net(nnx.Rngs(0), "batch")
    mean = ours.bn.mean
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 3))
    options = {"in_axes": (None, 0), "axis_name": "batch"}
    for _ in range(2):
        got = tc.vmap(apply, **options, policy="alias")(ours, x)
        want = nnx.vmap(apply, **options)(theirs, x)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        for a, b in zip(
            _state_leaves(ours, nnx.BatchStat), _state_leaves(theirs, nnx.BatchStat), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    assert ours.bn.mean is mean and ours.bn.mean[...].shape == (4,)
    assert not np.allclose(mean[...], 0.0)


def test_per_example_statistics_into_a_broadcast_model_is_the_key_path_error():
    model = Net(nnx.Rngs(0), None)  # statistics of each example alone: batched
    before = [np.asarray(a) for a in _state_leaves(model)]
    x = jnp.arange(24.0).reshape(8, 3)
    with pytest.raises(ValueError, match=r"^model\.bn\.mean\.value: .* wrote a batched value"):
        tc.vmap(apply, in_axes=(None, 0), policy="alias")(model, x)
    for a, b in zip(_state_leaves(model), before, strict=True):
        np.testing.assert_array_equal(a, b)
