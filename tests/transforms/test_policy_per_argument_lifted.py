"""A policy per argument for the lifted transformations (docs/semantics.md, "A policy per
argument"): ``grad``, ``value_and_grad``, ``vmap``, ``checkpoint``, ``shard_map``, ``cond``,
``switch`` and the loops take the dict ``jit`` takes. Each case is compared with the plain
Python program run on copies: what each caller object holds afterwards."""

from __future__ import annotations

import copy
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from helpers import float_rtol


def _equal(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(
        np.allclose(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def _loss(params, state, batch):
    batch["x"] = batch["x"] / 255  # normalised in place: the caller's batch must not see it
    state["n"] = state["n"] + 1
    state["mean"] = jnp.mean(batch["x"])
    return jnp.sum(params["w"] * batch["x"]) ** 2


def _inputs():
    params = {"w": jnp.arange(3.0)}
    state = {"n": jnp.zeros(()), "mean": jnp.zeros(())}
    batch = {"x": jnp.arange(3.0) * 255}
    return params, state, batch


@pytest.mark.parametrize("with_value", [False, True])
def test_grad_writes_the_aliased_state_and_leaves_the_batch_alone(with_value):
    params, state, batch = _inputs()
    plain_state, plain_batch = copy.deepcopy(state), copy.deepcopy(batch)
    value = _loss(params, plain_state, plain_batch)  # plain Python, on copies
    expected_grad = jax.grad(_loss)(params, copy.deepcopy(state), copy.deepcopy(batch))
    spec = {"state": "alias", ...: "clone"}
    with pytest.warns(tc.MutationWarning, match=r"batch\['x'\]: replaced"):
        if with_value:
            v, g = tc.value_and_grad(_loss, policy=spec)(params, state, batch)
            assert np.allclose(v, value)
        else:
            g = tc.grad(_loss, policy=spec)(params, state, batch)
    assert _equal(g, expected_grad)
    assert _equal(state, plain_state)  # written, as plain Python
    assert _equal(batch, _inputs()[2])  # untouched
    assert not _equal(batch, plain_batch)


def test_grad_with_a_strict_argument_raises_naming_only_it_caller_untouched():
    params, state, batch = _inputs()
    with pytest.raises(tc.MutationError) as err:
        tc.grad(_loss, policy={"state": "alias", "batch": "strict"})(params, state, batch)
    assert "batch['x']" in str(err.value) and "state" not in str(err.value)
    assert _equal((state, batch), _inputs()[1:])  # nothing written back


def test_vmap_writes_per_example_stats_and_leaves_the_batch_alone():
    def step(stats, batch):
        batch["x"] = batch["x"] - stats["mean"]  # in place, per example
        stats["seen"] = stats["seen"] + 1
        stats["mean"] = stats["mean"] + jnp.sum(batch["x"])
        return jnp.sum(batch["x"] ** 2)

    stats = {"mean": jnp.arange(4.0), "seen": jnp.zeros(4)}
    batch = {"x": jnp.arange(8.0).reshape(4, 2)}
    original_batch = copy.deepcopy(batch)
    plain_stats, plain_batch = copy.deepcopy(stats), copy.deepcopy(batch)
    expected = []
    for i in range(4):  # plain Python: a loop over the examples, on copies
        s = {k: v[i] for k, v in plain_stats.items()}
        b = {k: v[i] for k, v in plain_batch.items()}
        expected.append(step(s, b))
        for k in s:
            plain_stats[k] = plain_stats[k].at[i].set(s[k])
    with pytest.warns(tc.MutationWarning, match=r"batch\['x'\]: replaced"):
        out = tc.vmap(step, policy={"stats": "alias", ...: "clone"})(stats, batch)
    assert np.allclose(out, jnp.stack(expected))
    assert _equal(stats, plain_stats)
    assert _equal(batch, original_batch)


def test_vmap_a_batched_value_left_in_an_unmapped_cloned_argument_is_dropped():
    def step(stats, cfg, x):
        stats["s"] = stats["s"] + x
        cfg["last"] = x  # batched, into an argument mapped with None and left alone
        return x * 2

    stats, cfg = {"s": jnp.zeros(3)}, {"last": jnp.zeros(())}
    with pytest.warns(tc.MutationWarning, match=r"cfg\['last'\]"):
        out = tc.vmap(step, in_axes=(0, None, 0), policy={"cfg": "clone", ...: "alias"})(
            stats, cfg, jnp.arange(3.0)
        )
    assert np.allclose(out, [0.0, 2.0, 4.0])
    assert np.allclose(stats["s"], [0.0, 1.0, 2.0])
    assert float(cfg["last"]) == 0.0


def test_checkpoint_follows_each_arguments_policy_under_grad():
    def layer(x, state, scratch):
        state["calls"] = state["calls"] + 1
        scratch["tmp"] = x * 2
        return jnp.sin(x)

    state, scratch = {"calls": jnp.zeros(())}, {"tmp": jnp.zeros(())}
    f = tc.checkpoint(layer, policy={"state": "alias", ...: "clone"})
    with pytest.warns(tc.MutationWarning, match=r"scratch\['tmp'\]"):
        g = tc.grad(f, policy={"state": "alias", ...: "clone"})(jnp.ones(()), state, scratch)
    assert np.allclose(g, jnp.cos(1.0))
    assert float(state["calls"]) == 1.0 and float(scratch["tmp"]) == 0.0


def _layer(carry, layer):
    layer["count"] = layer["count"] + 1  # per-layer statistics, in the slice
    carry["h"] = jnp.tanh(carry["h"] @ layer["w"])
    return carry, jnp.sum(carry["h"])


def _stack():
    carry = {"h": jnp.ones(2)}
    layers = {"w": jnp.stack([jnp.eye(2) * 0.5] * 3), "count": jnp.zeros(3)}
    return carry, layers


def _plain_scan(carry, layers):
    ys = []
    for i in range(3):
        x = {k: v[i] for k, v in layers.items()}
        carry, y = _layer(carry, x)
        ys.append(y)
        for k in x:
            layers[k] = layers[k].at[i].set(x[k])
    return carry, jnp.stack(ys)


@pytest.mark.parametrize("xs", ["clone", "alias"])
def test_scan_over_layers_writes_init_and_writes_xs_only_when_aliased(xs):
    carry, layers = _stack()
    plain_carry, plain_layers = copy.deepcopy(carry), copy.deepcopy(layers)
    _, plain_ys = _plain_scan(plain_carry, plain_layers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, ys = tc.scan(_layer, carry, layers, policy={"init": "alias", "xs": xs})
    assert out is carry and _equal(carry, plain_carry)
    assert np.allclose(ys, plain_ys)
    if xs == "alias":
        assert _equal(layers, plain_layers)  # rule L7: the slices' changes are written
        assert not [w for w in caught if w.category is tc.MutationWarning]
    else:
        assert _equal(layers, _stack()[1])  # xs left alone, its change reported
        assert any("xs['count']" in str(w.message) for w in caught)


def test_scan_with_init_left_alone_and_xs_aliased_or_strict():
    carry, layers = _stack()
    plain_carry, plain_layers = copy.deepcopy(carry), copy.deepcopy(layers)
    expected, _ = _plain_scan(plain_carry, plain_layers)
    out, _ = tc.scan(_layer, carry, layers, policy={0: "strict", 1: "alias"})
    assert out is not carry and _equal(out, expected) and _equal(carry, _stack()[0])
    assert _equal(layers, plain_layers)
    with pytest.raises(tc.MutationError, match=r"xs\['count'\]"):
        tc.scan(_layer, carry, layers, policy={"xs": "strict", ...: "alias"})
    assert _equal(carry, _stack()[0])


def test_scan_a_container_in_init_and_xs_with_different_policies_is_an_error():
    carry = {"h": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"at init \(policy 'alias'\) is also at xs\['s'\]"):
        tc.scan(
            lambda c, x: (c, None),
            carry,
            {"a": jnp.zeros(3), "s": carry},
            policy={"init": "alias", "xs": "clone"},
        )


def test_fori_and_while_loop_take_a_dict_naming_their_one_carry():
    def body(i, acc):
        acc["n"] = acc["n"] + i
        return acc

    acc = {"n": jnp.zeros(())}
    assert tc.fori_loop(0, 4, body, acc, policy={"init_val": "alias"}) is acc
    assert float(acc["n"]) == 6.0
    state = {"n": jnp.ones(())}
    out = tc.while_loop(
        lambda s: s["n"] < 10, lambda s: {"n": s["n"] * 2}, state, policy={0: "strict"}
    )
    assert float(out["n"]) == 16.0 and float(state["n"]) == 1.0
    for bad in ({"init": "alias"}, {1: "alias"}):
        with pytest.raises(ValueError, match="fori_loop \\(init_val\\)"):
            tc.fori_loop(0, 4, body, acc, policy=bad)
    with pytest.raises(ValueError, match="scan \\(init, xs\\)"):
        tc.scan(_layer, *_stack(), policy={"carry": "alias"})


def _hit(state, log):
    state["hits"] = state["hits"] + 1
    return state["x"] * 2


def _miss(state, log):
    log.append(state["x"])  # changes the strict operand and does not return it
    return state["x"]


@pytest.mark.parametrize("api", ["cond", "switch"])
def test_cond_with_one_operand_aliased_and_one_strict(api):
    def run(pred, spec, state, log):
        if api == "cond":
            return tc.cond(pred, _hit, _miss, state, log, policy=spec)
        return tc.switch(int(pred), [_miss, _hit], state, log, policy=spec)

    state, log = {"x": jnp.array(3.0), "hits": jnp.array(0)}, []
    with pytest.raises(tc.MutationError, match="log: list resized") as err:
        run(True, {"state": "alias", "log": "strict"}, state, log)  # every branch is traced
    assert "state" not in str(err.value).split("\n")[1]
    assert int(state["hits"]) == 0 and log == []  # nothing written back

    def quiet(state, log):
        return state["x"]

    plain = copy.deepcopy(state)
    expected = _hit(plain, [])
    if api == "cond":
        out = tc.cond(True, _hit, quiet, state, log, policy={0: "alias", 1: "strict"})
    else:
        out = tc.switch(1, [quiet, _hit], state, log, policy={0: "alias", 1: "strict"})
    assert np.allclose(out, expected) and _equal(state, plain) and log == []
    with pytest.raises(ValueError, match="not an argument of _hit"):
        tc.cond(True, _hit, quiet, state, log, policy={"st": "alias"})


def test_a_policy_block_overrides_the_dict_for_every_transformation():
    params, state, batch = _inputs()
    with tc.policy("alias"):
        tc.grad(_loss, policy={"state": "strict", ...: "clone"})(params, state, batch)
    assert float(state["n"]) == 1.0  # both written: the state...
    # ...and the batch, 255 / 255 (0.99999994 on a TPU, which divides by the reciprocal)
    np.testing.assert_allclose(float(batch["x"][1]), 1.0, rtol=float_rtol())
    carry, layers = _stack()
    with tc.policy("alias"):
        tc.scan(_layer, carry, layers, policy={"init": "clone", "xs": "clone"})
    assert _equal(layers["count"], jnp.ones(3))
