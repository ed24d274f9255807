"""flax nnx models through ``treeclone.cond`` / ``switch`` (``alias``) against ``nnx.cond`` /
``nnx.switch`` on a copy of the same model: the same results and the same caller state
(a counter Variable each branch bumps differently, BatchNorm statistics updated by the
training branch only), eagerly and inside ``treeclone.jit`` with a traced predicate; under
``strict`` the Variable a branch updates without returning the model is named."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")

from nnx_models import Block  # noqa: E402 - after the skip


class Count(nnx.Variable):
    pass


class Net(Block):
    def __init__(self, rngs):
        super().__init__(3, 3, rngs=rngs)
        self.calls = Count(jnp.zeros((), jnp.int32))
        self.skips = Count(jnp.zeros((), jnp.int32))


def train(model, x):
    model.calls[...] += 1
    return model.bn(model.linear(x), use_running_average=False)


def evaluate(model, x):
    model.skips[...] += 1
    return model.bn(model.linear(x), use_running_average=True)


def frozen(model, x):
    return model.linear(x)


X = jax.random.normal(jax.random.PRNGKey(2), (5, 3))


def _assert_same_state(ours, theirs):
    a, b = nnx.state(ours), nnx.state(theirs)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
        assert not isinstance(u, jax.core.Tracer)


def test_alias_cond_equals_nnx_cond_on_a_copy():
    model, reference = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    mean, kernel = model.bn.mean, model.linear.kernel  # the caller's Variables
    for pred in (True, False, True, True):
        ours = tc.cond(pred, train, evaluate, model, X, policy="alias")
        theirs = nnx.cond(pred, train, evaluate, reference, X)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
        _assert_same_state(model, reference)
    assert model.bn.mean is mean and model.linear.kernel is kernel
    assert int(model.calls[...]) == 3 and int(model.skips[...]) == 1


def test_alias_cond_inside_jit_with_a_traced_predicate_equals_nnx():
    model, reference = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    step = tc.jit(
        lambda pred, m, x: tc.cond(pred, train, evaluate, m, x, policy="alias"), policy="alias"
    )
    ref_step = nnx.jit(lambda pred, m, x: nnx.cond(pred, train, evaluate, m, x))
    for pred in (True, False, False, True):
        ours = step(jnp.asarray(pred), model, X)
        theirs = ref_step(jnp.asarray(pred), reference, X)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
        _assert_same_state(model, reference)


def test_alias_switch_equals_nnx_switch_and_clamps():
    model, reference = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    branches = [train, evaluate, frozen]
    for index in (0, 2, 1, 7, -1):
        ours = tc.switch(index, branches, model, X, policy="alias")
        theirs = nnx.switch(index, branches, reference, X)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
        _assert_same_state(model, reference)


def test_alias_cond_under_grad_updates_the_statistics_as_nnx():
    def loss(model, x, pred):
        return jnp.mean(tc.cond(pred, train, evaluate, model, x, policy="alias") ** 2)

    def ref_loss(model, x, pred):
        return jnp.mean(nnx.cond(pred, train, evaluate, model, x) ** 2)

    model, reference = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    for pred in (True, False):
        grads = tc.grad(loss, allow_int=True, policy="alias")(model, X, pred)
        ref_grads = nnx.grad(ref_loss)(reference, X, pred)
        ours = nnx.state(grads, nnx.Param)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref_grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        _assert_same_state(model, reference)


def test_strict_names_the_variable_a_branch_updates_without_returning_the_model():
    model = Net(nnx.Rngs(0))
    with pytest.raises(tc.MutationError, match=r"model\.skips"):
        tc.cond(True, frozen, evaluate, model, X, policy="strict")
    assert int(model.skips[...]) == 0
