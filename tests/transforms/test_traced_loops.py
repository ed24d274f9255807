"""``traced=`` on ``scan``, ``fori_loop`` and ``while_loop``: an equinox Module in a loop's
carry, each loop checked against the equinox idiom it replaces (``eqx.partition`` around the
JAX loop, ``eqx.combine`` in the body and after it) under every policy, on hand-written and
generated Modules.

docs/semantics.md, "Leaves that are not arrays: ``traced=``"."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from helpers import float_rtol
from hypothesis import given, settings
from hypothesis import strategies as st

eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")

from eqx_models import (  # noqa: E402 - after the skips
    D,
    assert_same_leaves,
    assert_same_model,
    assert_statics_are,
    build,
    eqx_spec,
    sgd_step,
)

# Every policy, and one per argument (scan's init and xs; the others' init_val).
POLICIES = ["clone", "alias", "strict", "per-argument"]


def _policy(policy: str, api: str) -> Any:
    if policy != "per-argument":
        return policy
    return {"init": "alias", "xs": "strict"} if api == "scan" else {"init_val": "strict"}


class Tagged(eqx.Module):
    """An MLP with what a JAX loop cannot carry: its activation, a string, a Python int."""

    mlp: eqx.nn.MLP
    name: str
    depth: int

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.mlp(x)[0] * (1.0 + 0.1 * self.depth)


def _model(seed: int = 0) -> Tagged:
    return Tagged(eqx.nn.MLP(3, 1, 4, 2, key=jax.random.key(seed)), "tagged", 2)


def _batches(n: int = 4, size: int = 5) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(7), (n, size, 3))
    return x, jnp.sin(x.sum(-1))


def _loss(model: Tagged, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def _partitioned_scan(body: Any, init: Any, xs: Any) -> tuple[Any, Any]:
    """The equinox idiom: the carry's arrays through ``jax.lax.scan``, the rest closed over."""
    dynamic, static = eqx.partition(init, eqx.is_array)

    def inner(carry: Any, x: Any) -> tuple[Any, Any]:
        new, y = body(eqx.combine(carry, static), x)
        return eqx.partition(new, eqx.is_array)[0], y

    final, ys = jax.lax.scan(inner, dynamic, xs)
    return eqx.combine(final, static), ys


@pytest.mark.parametrize("policy", POLICIES)
def test_scan_accumulates_gradients_with_a_module_in_its_carry_as_eqx_partition(policy):
    """Gradient accumulation over micro-batches (the README's example): the Module and the
    summed gradients in the carry; then an optax update of the average, as equinox does it."""
    model, opt = _model(), optax.adamw(1e-2)
    opt_state = opt.init(eqx.filter(model, eqx.is_array))
    zeros = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_array))

    def accumulate(carry: tuple, batch: tuple) -> tuple[tuple, jax.Array]:
        model, total = carry
        loss, grads = eqx.filter_value_and_grad(_loss)(model, *batch)
        return (model, jax.tree.map(jnp.add, total, grads)), loss

    (got_model, got_total), losses = tc.scan(
        accumulate, (model, zeros), _batches(), policy=_policy(policy, "scan"), traced="arrays"
    )
    (want_model, want_total), want_losses = _partitioned_scan(
        accumulate, (model, zeros), _batches()
    )
    assert_same_leaves(got_total, want_total)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert_statics_are(got_model, model)  # the activation and the string: the caller's
    assert got_model.mlp.activation is model.mlp.activation and got_model.name == "tagged"
    updates, _ = opt.update(got_total, opt_state, eqx.filter(got_model, eqx.is_array))
    want_updates, _ = opt.update(want_total, opt_state, eqx.filter(want_model, eqx.is_array))
    assert_same_leaves(
        eqx.apply_updates(got_model, updates), eqx.apply_updates(want_model, want_updates)
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_scan_trains_a_module_and_its_optimizer_state_as_eqx_partition(policy):
    model, opt = _model(1), optax.adam(1e-2)
    opt_state = opt.init(eqx.filter(model, eqx.is_array))

    def train(carry: tuple, batch: tuple) -> tuple[tuple, jax.Array]:
        model, opt_state = carry
        loss, grads = eqx.filter_value_and_grad(_loss)(model, *batch)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return (eqx.apply_updates(model, updates), opt_state), loss

    got, losses = tc.scan(
        train, (model, opt_state), _batches(), policy=_policy(policy, "scan"), traced="arrays"
    )
    want, want_losses = _partitioned_scan(train, (model, opt_state), _batches())
    assert_same_leaves(got, want)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert_statics_are(got[0], model)


@pytest.mark.parametrize("policy", POLICIES)
def test_fori_loop_and_while_loop_carry_a_module_as_eqx_partition(policy):
    model, (x, y) = _model(2), _batches()
    dynamic, static = eqx.partition(model, eqx.is_array)

    def step(model: Tagged) -> Tagged:
        return sgd_step(model, x[0, 0], y[0, 0])[1]

    def fori_body(i: Any, dyn: Any) -> Any:
        return eqx.partition(step(eqx.combine(dyn, static)), eqx.is_array)[0]

    want = eqx.combine(jax.lax.fori_loop(0, 3, fori_body, dynamic), static)
    got = tc.fori_loop(
        0, 3, lambda i, m: step(m), model, policy=_policy(policy, "fori"), traced="arrays"
    )
    assert_same_model(got, want)
    assert_statics_are(got, model)

    def far(dyn: Any) -> Any:
        return jnp.abs(eqx.combine(dyn, static).mlp.layers[0].bias).sum() < 10.0

    def while_body(dyn: Any) -> Any:
        grown = eqx.tree_at(
            lambda m: m.mlp.layers[0].bias, eqx.combine(dyn, static), replace_fn=lambda b: b + 1.0
        )
        return eqx.partition(grown, eqx.is_array)[0]

    want = eqx.combine(jax.lax.while_loop(far, while_body, dynamic), static)

    def grow(m: Tagged) -> Tagged:
        return eqx.tree_at(lambda m: m.mlp.layers[0].bias, m, replace_fn=lambda b: b + 1.0)

    got = tc.while_loop(
        lambda m: jnp.abs(m.mlp.layers[0].bias).sum() < 10.0,
        grow,
        model,
        policy=_policy(policy, "while"),
        traced="arrays",
    )
    assert_same_model(got, want)
    assert_statics_are(got, model)


@settings(max_examples=profiles.max_examples(4))
@given(spec=eqx_spec, seed=st.integers(0, 2**16))
def test_property_a_scan_of_training_steps_on_generated_modules_is_eqx_partition(spec, seed):
    """Generated Modules (functions, strings, bools, Python numbers, NumPy leaves), two SGD
    steps in a scan under every policy against the ``eqx.partition`` idiom; the static leaves
    come back as the caller's very objects. No submodule at two places: the carry keeps its
    sharing (the loop's rule), and ``eqx.apply_updates`` rebuilds each place."""
    model = build(spec, seed, shared=False)
    xs = jax.random.normal(jax.random.key(seed), (2, D)), jnp.asarray([0.5, -0.5], jnp.float32)

    def body(m: Any, batch: tuple) -> tuple[Any, jax.Array]:
        loss, m = sgd_step(m, *batch)
        return m, loss

    want, want_losses = _partitioned_scan(body, model, xs)
    for policy in POLICIES:
        got, losses = tc.scan(body, model, xs, policy=_policy(policy, "scan"), traced="arrays")
        assert_same_model(got, want)
        assert_statics_are(got, model)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_static_leaf_the_body_changes_is_an_error_naming_its_key_path(policy):
    """A JAX loop's constants are the same at every iteration: a static leaf of the carry the
    body changes is a ValueError naming its key path (an equal new object is the caller's)."""

    def rename(c: dict, x: jax.Array) -> tuple[dict, None]:
        return {"w": c["w"] + x, "name": c["name"] + "!"}, None

    init = {"w": jnp.zeros(()), "name": "a"}
    with pytest.raises(ValueError, match=r"changed init\['name'\] from 'a' to 'a!'"):
        tc.scan(rename, init, jnp.ones(3), policy=_policy(policy, "scan"), traced="arrays")
    with pytest.raises(ValueError, match=r"changed init_val\['name'\]"):
        tc.fori_loop(
            0,
            2,
            lambda i, c: rename(c, i)[0],
            init,
            policy=_policy(policy, "fori"),
            traced="arrays",
        )

    def equal(c: dict, x: jax.Array) -> tuple[dict, None]:
        return {"w": c["w"] + x, "name": "".join(["#", c["name"]])[1:]}, None

    out, _ = tc.scan(equal, init, jnp.ones(3), policy=_policy(policy, "scan"), traced="arrays")
    assert out["name"] is init["name"] and float(out["w"]) == 3.0


@pytest.mark.parametrize("policy", POLICIES)
def test_without_traced_a_module_in_a_carry_is_an_error_naming_traced_arrays(policy):
    model = _model()
    wanted = r'init(_val)?\.mlp\.activation: .* not a valid JAX type.*traced="arrays"'
    with pytest.raises(TypeError, match=wanted):
        tc.scan(lambda m, x: (m, x), model, jnp.ones(2), policy=_policy(policy, "scan"))
    with pytest.raises(TypeError, match=wanted):
        tc.fori_loop(0, 2, lambda i, m: m, model, policy=_policy(policy, "fori"))
    with pytest.raises(TypeError, match=wanted):
        tc.while_loop(lambda m: False, lambda m: m, model, policy=_policy(policy, "while"))


def test_alias_writes_back_in_place_with_static_leaves_strict_raises_clone_warns():
    """Under alias the Python loop's result: the caller's dict, updated in place, its static
    leaves (a string, a function) as they were; strict's error and clone's report hold."""

    def bump(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
        state["w"] = state["act"](state["w"] + x)
        return state, state["w"]

    state = {"w": jnp.zeros(()), "act": jnp.tanh, "name": "run"}
    out, ys = tc.scan(bump, state, jnp.arange(3.0), policy="alias", traced="arrays")
    want = 0.0
    for x in range(3):
        want = np.tanh(want + x)
    assert out is state and state["act"] is jnp.tanh and state["name"] == "run"
    np.testing.assert_allclose(state["w"], want, rtol=float_rtol(1e-6))
    np.testing.assert_allclose(ys[-1], want, rtol=float_rtol(1e-6))

    def unreturned(state: dict, x: jax.Array) -> tuple[dict, None]:
        state["w"] = state["w"] + x
        return {"w": state["w"], "act": state["act"], "name": state["name"]}, None

    strict_state = {"w": jnp.zeros(()), "act": jnp.tanh, "name": "run"}
    with pytest.raises(tc.MutationError, match=r"init\['w'\]"):
        tc.scan(unreturned, strict_state, jnp.ones(2), policy="strict", traced="arrays")
    assert float(strict_state["w"]) == 0.0
    clone_state = {"w": jnp.zeros(()), "act": jnp.tanh, "name": "run"}
    with pytest.warns(tc.MutationWarning, match=r"under policy 'clone'(.|\n)*init\['w'\]"):
        out, _ = tc.scan(unreturned, clone_state, jnp.ones(2), policy="clone", traced="arrays")
    assert out is not clone_state and float(clone_state["w"]) == 0.0
    assert float(out["w"]) == 2.0 and out["act"] is jnp.tanh


@pytest.mark.parametrize("policy", POLICIES)
def test_static_leaves_in_xs_and_in_ys_are_given_and_returned_as_they_are(policy):
    """A static leaf of ``xs`` is in every slice as it is (never sliced); one the body returns
    in ``y`` comes back as it is (never stacked), as ``eqx.filter_vmap`` returns one."""
    xs = {"v": jnp.arange(3.0), "act": jnp.tanh, "tag": "t"}

    def body(c: jax.Array, x: dict) -> tuple[jax.Array, tuple]:
        assert x["tag"] == "t" and x["act"] is jnp.tanh
        return c + x["act"](x["v"]), (x["v"] * 2, x["tag"], len)

    total, (doubled, tag, fn) = tc.scan(
        body, jnp.zeros(()), xs, policy=_policy(policy, "scan"), traced="arrays"
    )
    np.testing.assert_allclose(total, np.tanh(np.arange(3.0)).sum(), rtol=float_rtol(1e-6))
    np.testing.assert_allclose(doubled, [0.0, 2.0, 4.0])
    assert tag == "t" and fn is len


@pytest.mark.parametrize("policy", POLICIES)
def test_arrays_only_give_the_same_results_with_and_without_traced(policy):
    def body(c: dict, x: jax.Array) -> tuple[dict, jax.Array]:
        return {"w": c["w"] * 0.5 + x, "n": c["n"] + 1}, c["w"]

    def init() -> dict:
        return {"w": jnp.ones(2), "n": jnp.zeros((), jnp.int32)}

    xs = jnp.arange(6.0).reshape(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.MutationWarning)
        got = tc.scan(body, init(), xs, policy=_policy(policy, "scan"), traced="arrays")
        want = tc.scan(body, init(), xs, policy=_policy(policy, "scan"))
    assert_same_leaves(got, want)
    assert_same_leaves(got, jax.lax.scan(body, init(), xs))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_static_leaf_that_changes_between_calls_is_a_new_trace(policy):
    """The loop's trace is kept per kind of call: a new static leaf is a new trace (never the
    old constant run on new arrays), an equal one is not."""
    traces = []

    def body(c: dict, x: jax.Array) -> tuple[dict, None]:
        traces.append(1)
        return {**c, "w": c["act"](c["w"] + x)}, None

    xs = -jnp.ones(2)
    relu, _ = tc.scan(
        body,
        {"w": jnp.zeros(()), "act": jax.nn.relu},
        xs,
        policy=_policy(policy, "scan"),
        traced="arrays",
    )
    again, _ = tc.scan(
        body,
        {"w": jnp.zeros(()), "act": jax.nn.relu},
        xs,
        policy=_policy(policy, "scan"),
        traced="arrays",
    )
    count = len(traces)
    tanh, _ = tc.scan(
        body,
        {"w": jnp.zeros(()), "act": jnp.tanh},
        xs,
        policy=_policy(policy, "scan"),
        traced="arrays",
    )
    assert float(relu["w"]) == float(again["w"]) == 0.0
    np.testing.assert_allclose(tanh["w"], np.tanh(np.tanh(-1.0) - 1.0), rtol=float_rtol(1e-6))
    assert len(traces) > count


class _Counter(eqx.Module):
    """A StateIndex counter: it sets its State itself (``state.set`` consumes the old one)."""

    index: eqx.nn.StateIndex
    name: str

    def __init__(self) -> None:
        self.index = eqx.nn.StateIndex(jnp.zeros((), jnp.int32))
        self.name = "counter"

    def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
        n = state.get(self.index) + 1
        return x * n, state.set(self.index, n)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("traced", [None, "arrays"])
def test_a_body_that_consumes_an_equinox_state_in_its_carry_is_jax_lax_scans(policy, traced):
    """The body threads an ``eqx.nn.State`` a layer sets (the old State left unreadable):
    a new State at its place, the caller's State left as it was and readable (rule L3), the
    results ``jax.lax.scan``'s (the State holds arrays only) under every policy."""
    counter, state = eqx.nn.make_with_state(_Counter)()

    def body(carry: tuple, x: jax.Array) -> tuple[tuple, jax.Array]:
        total, state = carry
        y, state = counter(x, state)
        return (total + y, state), y

    init = (jnp.zeros(()), state)
    (want_total, want_state), want_ys = jax.lax.scan(body, init, jnp.arange(1.0, 4.0))
    (total, new), ys = tc.scan(
        body, init, jnp.arange(1.0, 4.0), policy=_policy(policy, "scan"), traced=traced
    )
    np.testing.assert_allclose(ys, want_ys)
    np.testing.assert_allclose(total, want_total)
    assert int(new.get(counter.index)) == int(want_state.get(counter.index)) == 3
    assert int(state.get(counter.index)) == 0  # the caller's: as it was, readable

    def fori_body(i: Any, carry: tuple) -> tuple:
        return body(carry, i.astype(jnp.float32))[0]

    total, new = tc.fori_loop(0, 4, fori_body, init, policy=_policy(policy, "fori"), traced=traced)
    assert int(new.get(counter.index)) == 4 and float(total) == float(
        sum(i * (i + 1) for i in range(4))
    )
    assert int(state.get(counter.index)) == 0


def test_a_condition_that_changes_the_carry_is_reported_under_clone_with_traced():
    """As ``jax.lax.while_loop`` under clone: the condition's change to its copy is discarded
    and reported (alias's ValueError and strict's MutationError are the loop's rule L8)."""

    def cond(c: dict) -> jax.Array:
        c["seen"] = c["n"]
        return c["n"] < 3

    init = {"n": jnp.zeros(()), "seen": jnp.zeros(()), "act": jnp.tanh}
    with pytest.warns(tc.MutationWarning, match=r"init_val\['seen'\]"):
        out = tc.while_loop(cond, lambda c: {**c, "n": c["n"] + 1}, init, traced="arrays")
    assert float(out["n"]) == 3.0 and float(init["n"]) == 0.0
    with pytest.raises(ValueError, match="the loop's condition, changed the carry"):
        tc.while_loop(cond, lambda c: c, init, policy="alias", traced="arrays")
