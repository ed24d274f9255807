"""``treeclone.grad`` and ``value_and_grad`` under each policy (docs/semantics.md, "grad and
value_and_grad"): ``clone`` against ``jax.grad`` itself, ``alias`` against the same function
run un-transformed on NumPy copies of the caller's objects (for the caller's state) and
against ``jax.grad`` (for the gradients), ``strict`` against the MutationError."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from node_kinds import Scaled


def _params():
    return {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(0.25)}


def _stats():
    return {"calls": jnp.zeros(()), "seen": [], "last": jnp.zeros(3)}


def loss(params, stats, x):
    """A loss that updates running statistics in place while it is differentiated."""
    stats["calls"] = stats["calls"] + 1
    stats["seen"].append(x.sum())
    y = jnp.tanh(params["w"] * x + params["b"])
    stats["last"] = 0.9 * stats["last"] + 0.1 * y
    return jnp.sum(y**2)


def functional_loss(params, stats, x):
    """``loss`` on a copy of ``stats``: what jax.grad differentiates identically."""
    return loss(params, copy.copy({**stats, "seen": list(stats["seen"])}), x)


def numpy_copy(tree):
    return jax.tree.map(lambda a: np.array(a), tree)


def assert_same_values(got, want):
    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(want)
    assert got_def == want_def, (got_def, want_def)
    for a, b in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


X = jnp.array([0.5, 1.0, -1.5])


# --- clone ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"argnums": 1}, {"argnums": (0, 1)}, {"argnums": -3}, {"has_aux": True}],
    ids=["default", "argnums1", "argnums01", "negative", "has_aux"],
)
def test_clone_grad_is_jax_grad(options):
    def f(params, stats, x):
        value = functional_loss(params, stats, x) + jnp.sum(stats["last"])
        return (value, {"x": x}) if options.get("has_aux") else value

    for ours, theirs in [(tc.grad, jax.grad), (tc.value_and_grad, jax.value_and_grad)]:
        got = ours(f, **options)(_params(), _stats(), X)
        want = theirs(f, **options)(_params(), _stats(), X)
        assert_same_values(got, want)


def test_clone_grad_passes_non_differentiated_arguments_as_jax_grad_does():
    # jax.grad hands the arguments it does not differentiate to the function as they are, so
    # an in-place update of one reaches the caller, and a value that depends on the
    # differentiated ones leaks out as a tracer; clone is jax.grad, so it does the same.
    ours, theirs = _stats(), _stats()
    tc.grad(loss)(_params(), ours, X)
    jax.grad(loss)(_params(), theirs, X)
    for stats in (ours, theirs):
        assert float(stats["calls"]) == 1.0 and len(stats["seen"]) == 1
        assert isinstance(stats["last"], jax.core.Tracer)  # leaked: what alias avoids


# --- alias ----------------------------------------------------------------------------------


def test_alias_grad_equals_plain_python_and_jax_grad():
    params, stats = _params(), _stats()
    plain_stats = numpy_copy(stats)
    plain_value = loss(numpy_copy(params), plain_stats, np.asarray(X))

    seen_list = stats["seen"]
    value, grads = tc.value_and_grad(loss, policy="alias")(params, stats, X)
    np.testing.assert_allclose(value, plain_value, rtol=1e-6)
    assert_same_values(stats, plain_stats)  # the caller's objects, updated as plain Python
    assert stats["seen"] is seen_list  # the same list, grown in place
    assert all(isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer) for v in seen_list)
    assert_same_values(grads, jax.grad(functional_loss)(_params(), _stats(), X))
    assert grads is not params and grads["w"] is not params["w"]  # fresh, as jax.grad's


def test_alias_grad_steps_accumulate_on_the_callers_objects():
    stats = _stats()
    plain = numpy_copy(stats)
    g = tc.grad(loss, argnums=(0, 2), policy="alias")
    for _ in range(3):
        grads = g(_params(), stats, X)
        loss(numpy_copy(_params()), plain, np.asarray(X))
    assert_same_values(stats, plain)
    assert isinstance(grads, tuple) and len(grads) == 2
    assert_same_values(grads, jax.grad(functional_loss, argnums=(0, 2))(_params(), _stats(), X))


def test_alias_returned_aux_is_the_callers_object():
    def f(params, stats):
        stats["calls"] = stats["calls"] + 1
        return jnp.sum(params["w"] ** 2), (stats, params["b"])

    params, stats = _params(), _stats()
    (value, (aux_stats, b)), grads = tc.value_and_grad(f, has_aux=True, policy="alias")(
        params, stats
    )
    assert aux_stats is stats and float(stats["calls"]) == 1.0
    assert b is params["b"]  # an input returned untouched is the caller's own array
    grads_only, aux = tc.grad(f, has_aux=True, policy="alias")(params, stats)
    assert aux[0] is stats and float(stats["calls"]) == 2.0
    assert_same_values(grads_only, grads)
    np.testing.assert_allclose(value, 5.25)


def test_alias_gradient_has_jax_structure_of_the_argument():
    node = Scaled({"z": jnp.ones(2), "a": jnp.full(2, 2.0)}, 3.0)

    def f(node, stats):
        stats["calls"] = stats["calls"] + 1
        return node.scale * jnp.sum(node.w["z"] * node.w["a"])

    grads = tc.grad(f, policy="alias")(node, {"calls": jnp.zeros(())})
    want = jax.grad(f)(node, {"calls": jnp.zeros(())})
    assert jax.tree.structure(grads) == jax.tree.structure(want)
    assert list(grads.w) == list(want.w) == ["a", "z"]  # jax's (sorted) key order
    assert_same_values(grads, want)


def test_same_array_at_two_places_gets_its_total_gradient():
    a = jnp.array(3.0)

    def f(x, y):
        return x * y * 2.0

    ga, gb = tc.grad(f, argnums=(0, 1), policy="alias")(a, a)
    total = jax.grad(lambda x: f(x, x))(a)
    assert float(ga) == float(gb) == float(total) == 12.0
    # ... also when only one of the places is differentiated, and inside one argument.
    assert float(tc.grad(f, policy="alias")(a, a)) == 12.0
    tied = {"enc": a, "dec": a}
    grads = tc.grad(lambda p: p["enc"] * p["dec"], policy="strict")(tied)
    assert float(grads["enc"]) == float(grads["dec"]) == 6.0
    # clone is jax.grad: each place is its own input
    assert float(tc.grad(f)(a, a)) == float(jax.grad(f)(a, a)) == 6.0


def test_alias_raising_function_leaves_the_caller_untouched():
    def f(params, stats):
        stats["calls"] = stats["calls"] + 1
        stats["seen"].append(1.0)
        raise RuntimeError("boom")

    stats = _stats()
    with pytest.raises(RuntimeError, match="boom"):
        tc.grad(f, policy="alias")(_params(), stats)
    assert float(stats["calls"]) == 0.0 and stats["seen"] == []


def test_policy_block_overrides_the_grad_policy():
    stats = _stats()
    g = tc.grad(loss)  # clone
    with tc.policy("strict"), pytest.raises(tc.MutationError):
        g(_params(), stats, X)
    with tc.policy("alias"):
        g(_params(), stats, X)
    assert float(stats["calls"]) == 1.0


# --- strict ---------------------------------------------------------------------------------


def test_strict_unreturned_mutation_names_the_argument_and_key_path():
    stats = _stats()
    with pytest.raises(tc.MutationError) as info:
        tc.value_and_grad(loss, policy="strict")(_params(), stats, X)
    message = str(info.value)
    assert "stats['calls']: replaced" in message
    assert "stats['seen']: list resized from 0 to 1" in message
    assert float(stats["calls"]) == 0.0 and stats["seen"] == []


def test_strict_mutation_returned_in_aux_is_allowed_and_caller_untouched():
    def f(params, stats, x):
        return loss(params, stats, x), stats

    stats = _stats()
    grads, new_stats = tc.grad(f, has_aux=True, policy="strict")(_params(), stats, X)
    assert float(new_stats["calls"]) == 1.0 and len(new_stats["seen"]) == 1
    assert new_stats is not stats and float(stats["calls"]) == 0.0
    assert_same_values(grads, jax.grad(functional_loss)(_params(), _stats(), X))


# --- nesting --------------------------------------------------------------------------------


def test_jit_of_alias_grad_writes_back_and_equals_plain_python():
    g = tc.jit(tc.grad(loss, policy="alias"), policy="alias")
    stats = {"calls": jnp.zeros(()), "seen": [], "last": jnp.zeros(3)}
    plain = numpy_copy(stats)
    for _ in range(2):
        grads = g(_params(), stats, X)
        loss(numpy_copy(_params()), plain, np.asarray(X))
    assert_same_values(stats, plain)
    assert_same_values(grads, jax.grad(functional_loss)(_params(), _stats(), X))


def test_alias_grad_inside_an_alias_jitted_training_step():
    def step(params, stats, x):
        value, grads = tc.value_and_grad(loss, policy="alias")(params, stats, x)
        for k in params:  # SGD, in place
            params[k] = params[k] - 0.1 * grads[k]
        return value

    params, stats = _params(), _stats()
    plain_params, plain_stats = numpy_copy(params), numpy_copy(stats)
    jitted = tc.jit(step, policy="alias")
    for _ in range(3):
        value = jitted(params, stats, X)
        v, g = jax.value_and_grad(functional_loss)(plain_params, plain_stats, X)
        loss(plain_params, plain_stats, np.asarray(X))  # the statistics, as plain Python
        plain_params = {k: plain_params[k] - 0.1 * np.asarray(g[k]) for k in plain_params}
        np.testing.assert_allclose(value, v, rtol=1e-5)
    assert_same_values(params, plain_params)
    assert_same_values(stats, plain_stats)


def test_grad_of_alias_grad_equals_jax_and_updates_the_caller_once():
    def f(x, state):
        state["n"] = state["n"] + x
        return x**3

    state = {"n": jnp.zeros(())}
    second = tc.grad(tc.grad(f, policy="alias"), policy="alias")(2.0, state)
    assert float(second) == float(jax.grad(jax.grad(lambda x: x**3))(2.0)) == 12.0
    assert float(state["n"]) == 2.0  # the function ran once, as in plain Python
    assert not isinstance(state["n"], jax.core.Tracer)


def test_grad_inside_jit_inside_grad():
    def f(x, state):
        state["n"] = state["n"] + 1
        return jnp.sin(x) * x

    def outer(x, state):
        inner = tc.jit(tc.grad(f, policy="alias"), policy="alias")
        return inner(x, state) * 2.0

    state = {"n": jnp.zeros(())}
    got = tc.grad(outer, policy="alias")(1.5, state)
    want = jax.grad(lambda x: 2.0 * jax.grad(lambda y: jnp.sin(y) * y)(x))(1.5)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(state["n"]) == 1.0


# --- bad input ------------------------------------------------------------------------------


def test_integer_leaf_is_a_type_error_naming_its_path():
    params = {"w": jnp.ones(2), "step": jnp.zeros((), jnp.int32)}

    def f(params):
        return jnp.sum(params["w"])

    for policy in ("alias", "strict"):
        with pytest.raises(TypeError, match=r"params\['step'\]: grad requires real- or complex"):
            tc.grad(f, policy=policy)(params)
    got = tc.grad(f, allow_int=True, policy="alias")(params)
    want = jax.grad(f, allow_int=True)(params)
    assert got["step"].dtype == want["step"].dtype == jax.dtypes.float0
    with pytest.raises(TypeError, match=r"x: grad with holomorphic=True requires inputs"):
        tc.grad(lambda x: x, holomorphic=True, policy="alias")(jnp.ones(()))
    with pytest.raises(TypeError, match=r"\['s'\]: a value of type str"):
        tc.grad(lambda d: 1.0, policy="alias")({"s": "text"})


def test_jax_errors_are_jax_errors():
    with pytest.raises(TypeError, match="requires at least 2 positional arguments"):
        tc.grad(lambda x, y: x, argnums=1, policy="alias")(1.0)
    with pytest.raises(TypeError, match="scalar-output functions. Output had shape: \\(2,\\)"):
        tc.grad(lambda x: x, policy="alias")(jnp.ones(2))
    with pytest.raises(TypeError, match="aux output to return a two-element tuple"):
        tc.grad(lambda x: x, has_aux=True, policy="strict")(1.0)
    with pytest.raises(TypeError):
        tc.grad(abs, argnums="x")


def test_cycle_in_arguments_is_the_value_error_of_every_policy():
    loop = {"x": jnp.ones(())}
    loop["self"] = loop
    for policy in ("clone", "alias", "strict"):
        with pytest.raises(ValueError, match=r"the dict at d contains itself"):
            tc.grad(lambda d: d["x"], policy=policy)(loop)


def test_decorator_form_and_names():
    @tc.value_and_grad(policy="alias", argnums=0)
    def energy(x):
        """Energy."""
        return jnp.sum(x**2)

    assert energy.__name__ == "energy" and energy.__doc__ == "Energy."
    value, g = energy(jnp.ones(2))
    assert float(value) == 2.0 and g.tolist() == [2.0, 2.0]


def test_python_scalars_are_values_each_place_its_own_input():
    # One float object at two places is two inputs (rule J8: scalars are values), each with
    # its own gradient, as under jax.grad.
    one = 1.0
    d = {"a": one, "b": one}

    def f(d):
        return d["a"] * 1.0 + d["b"] * 2.0

    got = tc.grad(f, policy="alias")(d)
    assert got == jax.grad(f)(d) == {"a": 1.0, "b": 2.0}


def test_strict_names_a_keyword_argument_by_its_keyword():
    def f(x, *, state):
        state["n"] = state["n"] + 1
        return x * 2

    with pytest.raises(tc.MutationError, match=r"state\['n'\]: replaced"):
        tc.grad(f, policy="strict")(1.0, state={"n": jnp.zeros(())})
    state = {"n": jnp.zeros(())}
    value, g = tc.value_and_grad(f, policy="alias")(1.0, state=state)
    assert (float(value), float(g), float(state["n"])) == (2.0, 2.0, 1.0)


def test_negative_argnums_count_from_the_end_as_in_jax_grad():
    def f(x, y):
        return x * y

    assert float(tc.grad(f, argnums=-1, policy="alias")(2.0, 3.0)) == 2.0
    with pytest.raises(TypeError, match="requires at least 3 positional arguments"):
        tc.grad(f, argnums=-3, policy="alias")(2.0, 3.0)
