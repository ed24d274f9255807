"""``traced=`` on ``cond``, ``switch`` and ``shard_map``: an equinox Module among the
operands, each checked against the equinox idiom it replaces (``eqx.partition`` around the JAX
transformation, ``eqx.combine`` inside) under every policy.

docs/semantics.md, "Leaves that are not arrays: ``traced=``"."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

eqx = pytest.importorskip("equinox")

from eqx_models import NamedMLP, assert_same_leaves  # noqa: E402 - after the skip

POLICIES = ["clone", "alias", "strict", {"model": "alias", "x": "strict"}]


def _model() -> NamedMLP:
    return NamedMLP(eqx.nn.MLP(3, 2, 4, 1, activation=jnp.tanh, key=jax.random.key(0)), "tagged")


def _grow(model: NamedMLP, x: jax.Array) -> tuple[NamedMLP, jax.Array, str]:
    new = eqx.tree_at(lambda m: m.mlp.layers[0].bias, model, replace_fn=lambda b: b + x.sum())
    return new, new(x), model.name


def _shrink(model: NamedMLP, x: jax.Array) -> tuple[NamedMLP, jax.Array, str]:
    # A new Module too: a result that is an operand in one branch and new in the other has
    # no single plan (the rules of cond), whatever traced= says.
    new = eqx.tree_at(lambda m: m.mlp.layers[0].bias, model, replace_fn=lambda b: b - x.sum())
    return new, -new(x), model.name


def _partitioned_cond(pred: Any, model: NamedMLP, x: jax.Array) -> Any:
    """The equinox idiom: the Module's arrays through ``jax.lax.cond``, the rest closed
    over; each branch's result partitioned, its static part (the same in both) put back."""
    dynamic, static = eqx.partition(model, eqx.is_array)
    statics = []

    def lifted(branch: Any) -> Any:
        def run(d: Any, x: jax.Array) -> Any:
            dyn, stat = eqx.partition(branch(eqx.combine(d, static), x), eqx.is_array)
            statics.append(stat)
            return dyn

        return run

    out = jax.lax.cond(pred, lifted(_grow), lifted(_shrink), dynamic, x)
    return eqx.combine(out, statics[0])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("pred", [True, False, "traced"])
def test_cond_with_a_module_operand_is_eqx_partition(policy, pred):
    model, x = _model(), jnp.array([0.5, -1.0, 2.0])
    given = jnp.array(True) if pred == "traced" else pred
    want = _partitioned_cond(given, model, x)
    got = tc.cond(given, _grow, _shrink, model, x, policy=policy, traced="arrays")
    assert_same_leaves(got, want)
    assert got[0].mlp.activation is jnp.tanh and got[2] == "tagged"

    def inside(p: Any, model: NamedMLP, x: jax.Array) -> Any:
        return tc.cond(p, _grow, _shrink, model, x, policy=policy, traced="arrays")

    jitted = tc.jit(inside, traced="arrays", policy="alias")(jnp.asarray(bool(given)), model, x)
    assert_same_leaves(jitted, want)


@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
def test_switch_with_a_module_operand_is_eqx_partition(policy):
    model, x = _model(), jnp.array([1.0, 2.0, 3.0])
    dynamic, static = eqx.partition(model, eqx.is_array)

    def plain(i: int) -> Any:
        branches = [_shrink, _grow, _shrink]
        return branches[min(max(i, 0), 2)](model, x)

    for index in (0, 1, 7, jnp.asarray(1)):
        got = tc.switch(index, [_shrink, _grow, _shrink], model, x, policy=policy, traced="arrays")
        assert_same_leaves(got, plain(int(index)))
    want_arrays = jax.lax.switch(
        1,
        [
            lambda d, x, f=f: eqx.filter(f(eqx.combine(d, static), x), eqx.is_array)
            for f in (_shrink, _grow)
        ],
        dynamic,
        x,
    )
    assert_same_leaves(eqx.filter(got, eqx.is_array), want_arrays)


@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
def test_branches_that_leave_different_static_leaves_are_an_error_naming_the_key_path(policy):
    """A JAX cond cannot choose between two Python values: branches must leave the same
    static leaf (by value and type) at every place, or it is a ValueError naming it."""

    def hit(state: dict) -> dict:
        return {**state, "phase": "hit", "n": state["n"] + 1}

    def miss(state: dict) -> dict:
        return {**state, "phase": "miss"}

    state = {"n": jnp.zeros(()), "phase": "init"}
    with pytest.raises(
        ValueError, match=r"result\['phase'\]: true_fun leaves the static leaf 'hit'"
    ):
        tc.cond(jnp.array(True), hit, miss, state, policy=policy, traced="arrays")

    def done(state: dict) -> dict:
        return {**state, "phase": "".join(["do", "ne"]), "n": state["n"] + 1}

    def idle(state: dict) -> dict:
        return {**state, "phase": "done"}

    out = tc.cond(jnp.array(False), done, idle, state, policy=policy, traced="arrays")
    assert out["phase"] == "done" and float(out["n"]) == 0.0


def test_alias_writes_back_a_static_leaf_strict_raises_clone_warns():
    def hit(state: dict) -> None:
        state["phase"] = "stepped"
        state["n"] = state["n"] + 1

    def miss(state: dict) -> None:
        state["phase"] = "stepped"

    state = {"n": jnp.zeros(()), "phase": "init", "act": jnp.tanh}
    tc.cond(jnp.array(True), hit, miss, state, policy="alias", traced="arrays")
    assert state["phase"] == "stepped" and float(state["n"]) == 1.0 and state["act"] is jnp.tanh
    strict_state = {"n": jnp.zeros(()), "phase": "init", "act": jnp.tanh}
    with pytest.raises(tc.MutationError, match=r"state\['phase'\]"):
        tc.cond(jnp.array(True), hit, miss, strict_state, policy="strict", traced="arrays")
    assert strict_state["phase"] == "init"
    clone_state = {"n": jnp.zeros(()), "phase": "init", "act": jnp.tanh}
    with pytest.warns(tc.MutationWarning, match="phase"):
        tc.cond(jnp.array(True), hit, miss, clone_state, policy="clone", traced="arrays")
    assert clone_state["phase"] == "init" and float(clone_state["n"]) == 0.0


@pytest.mark.parametrize("policy", POLICIES)
def test_without_traced_a_function_operand_is_jaxs_error(policy):
    with pytest.raises(TypeError, match="not a valid JAX type"):
        tc.cond(jnp.array(True), _grow, _shrink, _model(), jnp.ones(3), policy=policy)


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]), ("data",))


def _shard_step(model: NamedMLP, stats: dict, x: jax.Array) -> tuple[jax.Array, str]:
    stats["total"] = stats["total"] + jax.lax.psum(x.sum(), "data")
    return jax.vmap(model)(x), model.name


@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
def test_shard_map_with_a_module_argument_is_eqx_partition(policy):
    """``eqx.partition`` around ``jax.shard_map``: the Module's arrays mapped with the
    in_specs, the static leaves closed over; a static leaf returned comes back as it is."""
    model, x = _model(), jnp.arange(12.0).reshape(4, 3) / 10
    specs = dict(mesh=_mesh(), in_specs=(P(), P(), P("data")), out_specs=(P("data"), P()))
    dynamic, static = eqx.partition(model, eqx.is_array)

    def theirs(d: Any, x: jax.Array) -> jax.Array:
        return jax.vmap(eqx.combine(d, static))(x)

    want = jax.shard_map(theirs, mesh=_mesh(), in_specs=(P(), P("data")), out_specs=P("data"))(
        dynamic, x
    )
    stats = {"total": jnp.zeros(())}
    f = tc.shard_map(_shard_step, policy=policy, traced="arrays", **specs)
    if policy == "strict":
        with pytest.raises(tc.MutationError, match=r"stats\['total'\]"):
            f(model, stats, x)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, name = f(model, stats, x)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert name == "tagged"
    total = float(stats["total"])
    if policy == "alias":
        assert total == pytest.approx(float(x.sum()), rel=1e-6) and not caught
    else:
        assert total == 0.0 and any(issubclass(w.category, tc.MutationWarning) for w in caught)


def test_shard_map_with_traced_needs_in_specs_and_checks_the_rule():
    with pytest.raises(ValueError, match="traced must be"):
        tc.shard_map(_shard_step, mesh=_mesh(), out_specs=P(), traced="everything")
    f = tc.shard_map(_shard_step, mesh=_mesh(), out_specs=(P("data"), P()), traced="arrays")
    with pytest.raises(TypeError, match="needs in_specs"):
        f(_model(), {"total": jnp.zeros(())}, jnp.ones((4, 3)))
