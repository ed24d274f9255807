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

from nnx_models import ReluBlock  # noqa: E402 - after the skips

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


# --- scan over layers: the stacked Blocks are xs, and what each does to its slice is written
# back (rule L7), as nnx.scan does for a module scanned over axis 0 ------------------------------

LAYERS = 3


class CountingBlock(ReluBlock):
    def __init__(self, rngs):
        super().__init__(4, 4, rngs=rngs, use_running_average=False)
        self.count = nnx.Variable(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.count[...] = self.count[...] + 1
        return super().__call__(x)


def stacked_blocks(seed):
    @nnx.split_rngs(splits=LAYERS)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return CountingBlock(rngs)

    return make(nnx.Rngs(seed))


def layer(x, block):
    return block(x), None


@nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
def nnx_layers(x, block):
    return block(x)


def assert_same_variables(a, b):
    """Every Variable (params, batch stats, the counter) has the same value in both."""
    sa, sb = nnx.state(a), nnx.state(b)
    assert jax.tree.structure(sa) == jax.tree.structure(sb)
    for (path, x), y in zip(jax.tree.leaves_with_path(sa), jax.tree.leaves(sb), strict=True):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path)
        )


def test_scan_over_layers_writes_each_blocks_state_back_as_nnx_scan():
    blocks = stacked_blocks(0)
    twin = nnx.clone(blocks)
    kernel, mean, count = blocks.linear.kernel, blocks.bn.mean, blocks.count
    x = jax.random.normal(jax.random.key(1), (8, 4))
    for _ in range(2):  # a second call reuses the trace and writes on from the first
        out, ys = tc.scan(layer, x, blocks, policy="alias")
        want = nnx_layers(x, twin)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        assert ys is None
    assert_same_variables(blocks, twin)
    np.testing.assert_array_equal(blocks.count[...], [2] * LAYERS)
    assert float(jnp.abs(blocks.bn.mean[...]).min(axis=1).max()) > 0  # every layer's stats
    # The caller's Variables, holding new stacked arrays for what changed only.
    assert blocks.linear.kernel is kernel and blocks.bn.mean is mean and blocks.count is count


def test_scan_over_layers_never_changed_params_stay_the_callers_arrays():
    blocks = stacked_blocks(2)
    kernel = blocks.linear.kernel.get_value()
    mean = blocks.bn.mean.get_value()
    tc.scan(layer, jnp.ones((8, 4)), blocks, policy="alias")
    assert blocks.linear.kernel.get_value() is kernel  # read only: no new stacked array
    assert blocks.bn.mean.get_value() is not mean


def test_scan_over_layers_training_inside_jit_matches_nnx_jit_and_nnx_scan():
    def loss_fn(model, x, y):
        return jnp.mean((tc.scan(layer, x, model, policy="alias")[0] - y) ** 2)

    def nnx_loss_fn(model, x, y):
        return jnp.mean((nnx_layers(x, model) - y) ** 2)

    @tc.jit(policy="alias")
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    @nnx.jit
    def nnx_train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(nnx_loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    blocks = stacked_blocks(3)
    optimizer = nnx.Optimizer(blocks, optax.adam(1e-2), wrt=nnx.Param)
    twin, twin_opt = nnx.clone((blocks, optimizer))
    keys = jax.random.split(jax.random.key(4), 2)
    x, y = jax.random.normal(keys[0], (8, 4)), jax.random.normal(keys[1], (8, 4))
    for _ in range(3):
        loss = train_step(blocks, optimizer, x, y)
        want = nnx_train_step(twin, twin_opt, x, y)
        np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert_same_variables(blocks, twin)
    assert_same_variables(optimizer, twin_opt)
    np.testing.assert_array_equal(blocks.count[...], [3] * LAYERS)
    assert int(optimizer.step[...]) == 3
    assert not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(nnx.state(blocks)))


def test_scan_over_layers_under_strict_names_the_slice_and_clone_leaves_the_blocks():
    blocks = stacked_blocks(5)
    before = nnx.clone(blocks)
    with pytest.raises(tc.MutationError, match=r"xs\.count: changed in place") as raised:
        tc.scan(layer, jnp.ones((8, 4)), blocks, policy="strict")
    assert "policy='alias', which writes what the body leaves in each slice" in str(raised.value)
    assert_same_variables(blocks, before)
    tc.scan(layer, jnp.ones((8, 4)), blocks)  # clone: JAX's loop
    assert_same_variables(blocks, before)


# --- fori_loop and while_loop: a module they carry is written back under alias -----------------


def test_a_module_carried_by_fori_loop_and_while_loop_is_written_back_as_nnx_loops():
    def body(i, block):
        block(jnp.full((8, 4), 1.0) * i + jnp.arange(4.0))  # counter and batch stats in place
        return block

    block, twin = CountingBlock(nnx.Rngs(6)), CountingBlock(nnx.Rngs(6))
    mean = block.bn.mean
    assert tc.fori_loop(0, 3, body, block, policy="alias") is block
    nnx.fori_loop(0, 3, body, twin)
    assert block.bn.mean is mean and int(block.count[...]) == 3
    assert_same_variables(block, twin)

    def cond(b):
        return b.count[...] < 5

    def while_body(b):
        return body(b.count[...], b)

    assert tc.while_loop(cond, while_body, block, policy="alias") is block
    nnx.while_loop(cond, while_body, twin)
    assert int(block.count[...]) == 5
    assert_same_variables(block, twin)
