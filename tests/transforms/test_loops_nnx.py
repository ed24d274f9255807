"""flax nnx Modules through ``treeclone.scan(policy="alias")`` against ``nnx.scan`` (with
``nnx.Carry``) on a copy of the same model: the same results and the same caller state
(docs/semantics.md, rule L10)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

CARRY_AND_SCANNED = {"in_axes": (nnx.Carry, 0), "out_axes": (nnx.Carry, 0)}


class Counted(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 3, rngs=rngs)
        self.count = nnx.Variable(jnp.zeros((), jnp.int32))
        self.total = nnx.Variable(jnp.zeros(()))


def forward(model, x):
    model.count[...] = model.count[...] + 1
    y = model.lin(x)
    model.total[...] = model.total[...] + jnp.sum(y)
    return model, jnp.tanh(y)


def assert_same_state(a, b):
    sa, sb = nnx.state(a), nnx.state(b)
    assert jax.tree.structure(sa) == jax.tree.structure(sb)
    for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_module_with_a_counter_through_scan_matches_nnx_scan():
    model = Counted(nnx.Rngs(0))
    twin = nnx.clone(model)
    lin, count = model.lin, model.count
    xs = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    out, ys = tc.scan(forward, model, xs, policy="alias")
    want_out, want_ys = nnx.scan(forward, **CARRY_AND_SCANNED)(twin, xs)
    assert out is model and model.lin is lin and model.count is count  # the caller's objects
    assert want_out is twin
    np.testing.assert_allclose(ys, want_ys, rtol=1e-6)
    assert int(model.count[...]) == 4
    assert_same_state(model, twin)


def test_nnx_optimizer_stepped_inside_scan_matches_nnx_scan():
    def loss_fn(model, x, y):
        return jnp.mean((model.lin(x) - y) ** 2)

    def train_step(carry, batch):
        model, optimizer = carry
        loss, grads = nnx.value_and_grad(loss_fn)(model, *batch)
        optimizer.update(model, grads)
        model.count[...] = model.count[...] + 1
        return carry, loss

    model = Counted(nnx.Rngs(1))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    twin_model, twin_opt = nnx.clone((model, optimizer))
    kernel = model.lin.kernel
    key_x, key_y = jax.random.split(jax.random.key(0))
    batches = (jax.random.normal(key_x, (6, 8, 3)), jax.random.normal(key_y, (6, 8, 3)))

    carry = (model, optimizer)
    out, losses = tc.scan(train_step, carry, batches, policy="alias")
    _, want = nnx.scan(train_step, **CARRY_AND_SCANNED)((twin_model, twin_opt), batches)

    assert out[0] is model and out[1] is optimizer and model.lin.kernel is kernel
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert int(optimizer.step[...]) == 6 == int(twin_opt.step[...])
    assert_same_state(model, twin_model)
    assert_same_state(optimizer, twin_opt)
    assert not any(
        isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(nnx.state((model, optimizer)))
    )


def test_module_through_fori_loop_under_strict_is_not_written():
    model = Counted(nnx.Rngs(2))

    def body(i, m):
        m.count[...] = m.count[...] + i
        return m

    out = tc.fori_loop(0, 4, body, model, policy="strict")
    assert out is not model and int(out.count[...]) == 6 and int(model.count[...]) == 0


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_a_variable_changed_in_place_then_replaced_is_an_error(policy):
    # The Variable's value is in no __dict__: the change is seen through its pytree children.
    model = Counted(nnx.Rngs(3))

    def body(m, x):
        m.count[...] = m.count[...] + 1  # in place on the caller's Variable ...
        return Counted(nnx.Rngs(4)), None  # ... which the carry then replaces

    with pytest.raises(ValueError, match=r"init\.count: changed in place"):
        tc.scan(body, model, jnp.arange(3.0), policy=policy)
    assert int(model.count[...]) == 0
