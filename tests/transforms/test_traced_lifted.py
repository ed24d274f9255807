"""``traced=`` on the lifted transformations (vmap, checkpoint): equinox's
``filter_vmap`` and ``filter_checkpoint``, under every policy.

docs/semantics.md, "Leaves that are not arrays: ``traced=``"."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from helpers import float_rtol

POLICIES = ["clone", "alias", "strict"]


class Tagged(eqx.Module):
    """A Module with what jax.jit cannot trace: a function field and a string field."""

    lin: eqx.nn.Linear
    name: str
    act: object

    def __call__(self, x):
        return self.act(self.lin(x))


def _make(key):
    return Tagged(eqx.nn.Linear(3, 2, key=key), "tagged", jax.nn.relu)


def _keys(n=4):
    return jax.random.split(jax.random.PRNGKey(0), n)


def _close(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        if eqx.is_array(x):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
        else:
            assert x is y or x == y


@pytest.mark.parametrize("policy", POLICIES)
def test_vmap_builds_an_ensemble_as_filter_vmap(policy):
    ensemble = tc.vmap(_make, policy=policy, traced="arrays")(_keys())
    expected = eqx.filter_vmap(_make)(_keys())
    assert jax.tree.structure(ensemble) == jax.tree.structure(expected)
    _close(ensemble, expected)
    assert ensemble.act is jax.nn.relu and ensemble.name == "tagged"  # static: as they are
    assert ensemble.lin.weight.shape == (4, 2, 3)


@pytest.mark.parametrize("policy", POLICIES)
def test_vmap_over_an_ensemble_and_with_an_unmapped_model(policy):
    ensemble = eqx.filter_vmap(_make)(_keys())
    x = jnp.arange(12.0).reshape(4, 3) - 5

    def apply(model, x):
        return model(x), model.name

    out = tc.vmap(apply, policy=policy, traced="arrays")(ensemble, x)
    _close(out, eqx.filter_vmap(apply)(ensemble, x))
    single = _make(_keys()[0])
    # The string is returned from a place mapped with None and along out_axes 0: a static
    # leaf is one value, never mapped, as under filter_vmap.
    out = tc.vmap(apply, in_axes=(None, 0), policy=policy, traced="arrays")(single, x)
    _close(out, eqx.filter_vmap(apply, in_axes=(None, 0))(single, x))
    assert out[1] == "tagged"


def test_vmap_with_a_static_leaf_never_maps_it_whatever_in_axes_says():
    state = {"w": jnp.arange(6.0).reshape(3, 2), "act": jnp.tanh}
    out = tc.vmap(lambda s: s["act"](s["w"]), policy="alias", traced="arrays")(state)
    want = np.tanh(np.arange(6.0).reshape(3, 2))
    np.testing.assert_allclose(out, want, rtol=float_rtol(1e-6))  # the TPU's tanh: 3e-5
    for policy in POLICIES:  # without traced=, jax.vmap's TypeError (naming the key path)
        with pytest.raises(TypeError, match="not a valid JAX type"):
            tc.vmap(lambda s: s["act"](s["w"]), policy=policy)(state)
    with pytest.raises(TypeError, match=r"s\['act'\]: argument"):
        tc.vmap(lambda s: s["act"](s["w"]), policy="alias")(state)


def test_vmap_alias_writes_back_in_place_changes_and_a_replaced_static_leaf():
    """Under alias the caller's objects change as the Python loop over the batch changes
    them: the batched entry gets each example's value, the replaced string its new value."""
    state = {"total": jnp.zeros(3), "phase": "init"}
    xs = jnp.arange(3.0)

    def step(state, x):
        state["total"] = state["total"] + x
        state["phase"] = "stepped"
        return x * 2

    out = tc.vmap(step, policy="alias", traced="arrays")(state, xs)
    np.testing.assert_allclose(out, [0.0, 2.0, 4.0])
    np.testing.assert_allclose(state["total"], [0.0, 1.0, 2.0])
    assert state["phase"] == "stepped"

    clone_state = {"total": jnp.zeros(3), "phase": "init"}
    with pytest.warns(tc.MutationWarning):  # clone discards, loudly (rule J4)
        tc.vmap(step, policy="clone", traced="arrays")(clone_state, xs)
    assert clone_state["phase"] == "init"
    strict_state = {"total": jnp.zeros(3), "phase": "init"}
    with pytest.raises(tc.MutationError, match="phase"):
        tc.vmap(step, policy="strict", traced="arrays")(strict_state, xs)
    assert strict_state["phase"] == "init"


def _loss(model, x):
    return jnp.sum(model(x) ** 2)


@pytest.mark.parametrize("policy", POLICIES)
def test_checkpoint_equals_filter_checkpoint_with_gradients(policy):
    model, x = _make(_keys()[1]), jnp.array([0.5, -1.0, 2.0])

    def ours(model, x):
        return tc.checkpoint(_loss, policy=policy, traced="arrays")(model, x)

    def theirs(model, x):
        return eqx.filter_checkpoint(_loss)(model, x)

    _close(ours(model, x), theirs(model, x))
    value, grads = tc.value_and_grad(ours, wrt="arrays")(model, x)
    expected_value, expected = eqx.filter_value_and_grad(theirs)(model, x)
    _close(value, expected_value)
    assert jax.tree.structure(grads) == jax.tree.structure(expected)
    _close(grads, expected)
    jitted = tc.jit(ours, policy=policy, traced="arrays")(model, x)  # inside jit as well
    _close(jitted, expected_value)


def test_checkpoint_keys_its_trace_on_the_static_leaves():
    """jax.checkpoint reuses a trace for the same structure: a static leaf that changes is
    a new trace, never the old function run on new arrays."""
    f = tc.checkpoint(lambda m, x: m(x), policy="alias", traced="arrays")
    model, x = _make(_keys()[2]), -jnp.ones(3)
    relu = f(model, x)
    tanh = f(eqx.tree_at(lambda m: m.act, model, jnp.tanh), x)
    np.testing.assert_allclose(relu, jax.nn.relu(model.lin(x)))
    np.testing.assert_allclose(tanh, jnp.tanh(model.lin(x)), rtol=1e-6)


def test_checkpoint_returns_static_results_as_they_are():
    model = _make(_keys()[3])
    out = tc.checkpoint(lambda m: (m.act, m.name, 3), policy="alias", traced="arrays")(model)
    assert out == (jax.nn.relu, "tagged", 3)


def test_an_unhashable_static_leaf_is_an_error_naming_its_key_path():
    """Under checkpoint (whose trace JAX keys on the static leaves); vmap accepts one, as
    eqx.filter_vmap does (tests/transforms/test_static_leaf_values.py)."""

    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

    tree = {"w": jnp.ones(2), "opts": [Unhashable()]}
    lifted = tc.checkpoint(lambda t: t["w"], policy="alias", traced="arrays")
    with pytest.raises(TypeError, match=r"t\['opts'\]\[0\]: a static leaf under traced="):
        lifted(tree)
    out = tc.vmap(lambda t: t["w"], policy="alias", traced="arrays")(tree)
    np.testing.assert_allclose(out, tree["w"])


def test_a_predicate_decides():
    """A predicate on a leaf: here the int array is left static too (a closed-over index)."""
    tree = {"w": jnp.arange(4.0), "i": np.int32(2)}

    def pick(t):
        return t["w"][int(t["i"])]  # int(): only a static leaf can be a Python index

    rule = lambda x: isinstance(x, jax.Array)  # noqa: E731 - NumPy stays static
    assert float(tc.checkpoint(pick, policy="alias", traced=rule)(tree)) == 2.0
    with pytest.raises(jax.errors.ConcretizationTypeError):
        tc.checkpoint(pick, policy="alias", traced="arrays")(tree)
