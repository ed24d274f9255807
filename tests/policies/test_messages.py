"""Errors and warnings that have a treeclone remedy name it (issue 49, item 5): each case is
triggered the way a user porting nnx, equinox or optax code meets it, under every policy, and
following the advice gives the library's own result (nnx.grad, plain Python, jax.jit on the
functional form)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import treeclone as tc
from flax import nnx
from jax.core import Tracer
from jax.experimental import checkify

# Every policy, and a per-argument dict (the first argument written back, the others cloned).
POLICIES: list[Any] = ["clone", "alias", "strict", {0: "alias", ...: "clone"}]


# --- grad: an integer or key leaf names wrt= ---------------------------------------------------


class _Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(3, 2, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.drop(self.linear(x))


def _loss(model: _Net, x: jax.Array) -> jax.Array:
    return jnp.sum(model(x) ** 2)


_X = jnp.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("transform", [tc.grad, tc.value_and_grad])
def test_grad_of_an_nnx_model_with_dropout_names_wrt_param(
    transform: Callable, policy: Any
) -> None:
    model = _Net(nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"(?s)model\.drop\.rngs\..*wrt=nnx\.Param"):
        transform(_loss, policy=policy)(model, _X)
    # The advice is nnx.grad's result: the same gradient, and under alias the Dropout's RNG
    # count advances in the model as nnx.grad advances it.
    ours, theirs = _Net(nnx.Rngs(0)), _Net(nnx.Rngs(0))
    if policy == "strict":  # Dropout advances its RNG count in place, and does not return it
        with pytest.raises(tc.MutationError, match=r"model\.drop\.rngs\.count"):
            transform(_loss, policy=policy, wrt=nnx.Param)(ours, _X)
        return
    got = transform(_loss, policy=policy, wrt=nnx.Param)(ours, _X)
    want = (nnx.value_and_grad if transform is tc.value_and_grad else nnx.grad)(_loss)(theirs, _X)
    jax.tree.map(np.testing.assert_allclose, got, want)
    count = ours.drop.rngs.count.value
    expected = theirs.drop.rngs.count.value if policy != "clone" else 0
    np.testing.assert_array_equal(count, expected)


@pytest.mark.parametrize("policy", POLICIES)
def test_grad_of_a_tree_with_an_integer_leaf_names_wrt_arrays(policy: Any) -> None:
    def loss(params: dict) -> jax.Array:
        return jnp.sum(params["w"] ** 2) * params["steps"]

    params = {"w": jnp.ones(2), "steps": jnp.array(3)}
    with pytest.raises(TypeError, match=r"(?s)params\['steps'\].*wrt='arrays'"):
        tc.grad(loss, policy=policy)(params)
    got = tc.grad(loss, policy=policy, wrt="arrays")(params)
    np.testing.assert_allclose(got["w"], jax.grad(lambda w: loss({**params, "w": w}))(params["w"]))


# --- jit: a leaf that is not an array names traced="arrays" --------------------------------------


def _apply(model: eqx.nn.MLP, x: jax.Array) -> jax.Array:
    return jax.vmap(model)(x)


_MLP = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(0))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("options", [{}, {"donate_argnums": 1}])
def test_jit_of_an_equinox_module_with_a_function_leaf_names_traced_arrays(
    policy: Any, options: dict
) -> None:
    with pytest.raises(TypeError, match=r"(?s)model\.activation.*traced='arrays'"):
        tc.jit(_apply, policy=policy, **options)(_MLP, _X)
    got = tc.jit(_apply, policy=policy, traced="arrays", **options)(_MLP, jnp.array(_X))
    np.testing.assert_allclose(got, eqx.filter_jit(_apply)(_MLP, _X), rtol=1e-6)


@pytest.mark.parametrize("policy", [None, "alias", "strict"])
def test_jit_partial_with_an_equinox_module_names_traced_arrays(policy: Any) -> None:
    with pytest.raises(TypeError, match=r"(?s)model\.activation.*traced='arrays'"):
        tc.jit_partial(_apply, _MLP, policy=policy)(_X)
    got = tc.jit_partial(_apply, _MLP, policy=policy, traced="arrays")(jnp.array(_X))
    np.testing.assert_allclose(got, eqx.filter_jit(_apply)(_MLP, _X), rtol=1e-6)


def test_other_type_errors_are_left_as_they_are() -> None:
    def bad(x: jax.Array) -> jax.Array:
        raise TypeError("the function's own")

    for policy in POLICIES:
        with pytest.raises(TypeError, match="^the function's own") as info:
            tc.jit(bad, policy=policy)(_X)
        assert "traced=" not in str(info.value)


# --- jit_partial's default: the warning shows the per-argument dict ----------------------------


def _normalise(state: dict, batch: dict) -> jax.Array:
    batch["x"] = batch["x"] / 255
    state["seen"] = state["seen"] + batch["x"].sum()
    return state["seen"]


def test_jit_partials_warning_names_the_per_argument_dict_that_fixes_it() -> None:
    state, batch = {"seen": jnp.zeros(())}, {"x": jnp.full(2, 255.0)}
    with pytest.warns(tc.MutationWarning, match="batch") as record:
        tc.jit_partial(_normalise, state)(batch)
    text = str(record[0].message)
    assert "policy={'state': 'alias', 'batch': 'alias'}" in text, text
    np.testing.assert_array_equal(batch["x"], 255.0)  # the default left the batch alone
    # The dict the warning shows is the plain Python program.
    state, batch = {"seen": jnp.zeros(())}, {"x": jnp.full(2, 255.0)}
    plain_state, plain_batch = {"seen": np.zeros(())}, {"x": np.full(2, 255.0)}
    fixed = tc.jit_partial(_normalise, state, policy={"state": "alias", "batch": "alias"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.MutationWarning)
        for _ in range(2):
            fixed(batch)
            _normalise(plain_state, plain_batch)
    np.testing.assert_allclose(batch["x"], plain_batch["x"])
    np.testing.assert_allclose(state["seen"], plain_state["seen"])


def test_a_jit_dict_policy_warning_names_the_argument_and_the_others() -> None:
    def normalise(state: dict, batch: dict) -> jax.Array:  # its own trace: warned at it
        return _normalise(state, batch)

    state, batch = {"seen": jnp.zeros(())}, {"x": jnp.full(2, 255.0)}
    jitted = tc.jit(normalise, policy={"state": "alias", ...: "clone"})
    with pytest.warns(tc.MutationWarning, match=re.escape("'alias' for 'batch'")):
        jitted(state, batch)


# --- JAX's own transformation inside an alias step names treeclone's ---------------------------


def _inside(transform: str) -> Callable[[dict, jax.Array], jax.Array]:
    """A step whose function, run by JAX's ``transform``, changes the step's ``state`` in place
    through a closure (the change JAX drops)."""

    def bump(x: jax.Array) -> jax.Array:
        state_box[0]["n"] = state_box[0]["n"] + x
        return x

    state_box: list[dict] = []

    def step(state: dict, x: jax.Array) -> jax.Array:
        state_box[:] = [state]
        if transform == "scan":
            return jax.lax.scan(lambda c, xi: (c + bump(xi), None), 0.0, x)[0]
        if transform == "fori_loop":
            return jax.lax.fori_loop(0, 2, lambda i, c: c + bump(x[0]), 0.0)
        if transform == "while_loop":
            return jax.lax.while_loop(lambda c: c < 2, lambda c: c + bump(x[0]), 0.0)
        if transform == "cond":
            return jax.lax.cond(x[0] > 0, lambda y: bump(y), lambda y: y, x[0])
        if transform == "switch":
            return jax.lax.switch(0, [lambda y: bump(y), lambda y: y], x[0])
        if transform == "vmap":
            return jax.vmap(bump)(x).sum()
        if transform == "grad":
            return jax.grad(lambda y: bump(y).sum())(x).sum()
        if transform == "checkpoint":
            return jax.checkpoint(bump)(x).sum()
        return jax.jit(bump)(x).sum()

    return step


_TREECLONE_FOR = {
    "scan": ("jax.lax.scan", "treeclone.scan"),
    "fori_loop": ("jax.lax.fori_loop", "treeclone.fori_loop"),
    "while_loop": ("jax.lax.while_loop", "treeclone.while_loop"),
    "cond": ("jax.lax.cond", "treeclone.cond"),
    "switch": ("jax.lax.switch", "treeclone.switch"),
    "vmap": ("jax.vmap", "treeclone.vmap"),
    "grad": ("jax.grad", "treeclone.grad"),
    "checkpoint": ("jax.checkpoint", "treeclone.checkpoint"),
    "jit": ("jax.jit", "treeclone.jit"),
}


@pytest.mark.parametrize("policy", ["alias", "strict", {"state": "alias", ...: "clone"}])
@pytest.mark.parametrize("transform", list(_TREECLONE_FOR))
def test_a_change_made_inside_jaxs_transformation_names_treeclones(
    transform: str, policy: Any
) -> None:
    jax_name, ours = _TREECLONE_FOR[transform]
    state = {"n": jnp.zeros(())}
    pattern = rf"(?s)state\['n'\] in place inside {re.escape(jax_name)}.*Use {re.escape(ours)}"
    with pytest.raises(ValueError, match=pattern):
        tc.jit(_inside(transform), policy=policy)(state, jnp.ones(2))
    assert not isinstance(state["n"], Tracer)
    np.testing.assert_array_equal(state["n"], 0.0)  # nothing written


def test_under_clone_the_change_is_dropped_as_jax_jit_drops_it() -> None:
    # Clone is jax.jit's own call: JAX keeps the change inside its copy and drops it.
    state = {"n": jnp.zeros(())}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        got = tc.jit(_inside("cond"))(state, jnp.ones(2))
    want = jax.jit(_inside("cond"))({"n": jnp.zeros(())}, jnp.ones(2))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(state["n"], 0.0)


def test_the_named_remedy_is_the_plain_python_program() -> None:
    # treeclone.scan with the state in its carry, as the message says: plain Python's result.
    def step(state: dict, xs: jax.Array) -> jax.Array:
        def body(s: dict, x: jax.Array) -> tuple[dict, None]:
            s["n"] = s["n"] + x
            return s, None

        tc.scan(body, state, xs, policy="alias")
        return state["n"]

    state, plain = {"n": jnp.zeros(())}, {"n": np.zeros(())}
    tc.jit(step, policy="alias")(state, jnp.arange(3.0))
    for x in np.arange(3.0):
        plain["n"] = plain["n"] + x
    np.testing.assert_allclose(state["n"], plain["n"])


@pytest.mark.parametrize(
    ("jax_name", "around"),
    [
        ("jax.lax.scan", lambda f, s: jax.lax.scan(lambda c, w: (c + f(s, w), None), 0.0, _X)),
        ("jax.vmap", lambda f, s: jax.vmap(f, in_axes=(None, 0))(s, _X)),
        ("jax.lax.cond", lambda f, s: jax.lax.cond(True, lambda w: f(s, w), jnp.sum, _X[0])),
    ],
)
def test_an_alias_call_inside_jaxs_transformation_names_treeclones(
    jax_name: str, around: Callable
) -> None:
    def record(stats: dict, w: jax.Array) -> jax.Array:
        stats["last"] = w.sum()
        return w.sum()

    stats = {"last": jnp.zeros(())}
    ours = "treeclone." + jax_name.rsplit(".", 1)[1]
    pattern = rf"(?s)inside a JAX transformation \({re.escape(jax_name)}\).*Use {re.escape(ours)}"
    with pytest.raises(ValueError, match=pattern):
        around(tc.jit(record, policy="alias"), stats)
    np.testing.assert_array_equal(stats["last"], 0.0)


# --- checkify: inside the alias step, around a functional part ----------------------------------

_OPT = optax.adam(0.1)


def _train_state() -> dict:
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    return {"params": params, "opt": _OPT.init(params), "steps": jnp.zeros((), jnp.int32)}


def _update(params: dict, opt_state: Any, x: jax.Array) -> tuple[jax.Array, dict, Any]:
    """One optax step, functional, with checkify's checks."""
    checkify.check(jnp.all(jnp.isfinite(x)), "x is not finite: {}", x.sum())

    def loss(p: dict) -> jax.Array:
        return jnp.sum((p["w"] * x) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = _OPT.update(grads, opt_state)
    return value, optax.apply_updates(params, updates), opt_state


def _checked_step(state: dict, x: jax.Array) -> tuple[checkify.Error, jax.Array]:
    """The documented way: checkify inside the alias step, on the functional part; the step
    assigns what it returns and returns checkify's Error."""
    err, (value, state["params"], state["opt"]) = checkify.checkify(_update)(
        state["params"], state["opt"], x
    )
    state["steps"] = state["steps"] + 1
    return err, value


def _mutating_step(state: dict, x: jax.Array) -> jax.Array:
    """The same step written in place: what cannot be checkified around an alias step."""
    value, state["params"], state["opt"] = _update(state["params"], state["opt"], x)
    state["steps"] = state["steps"] + 1
    return value


_BATCHES = [jnp.ones(3), jnp.array([1.0, jnp.nan, 2.0]), jnp.full(3, 0.5)]


def test_checkify_inside_an_alias_step_gives_jax_jits_errors_and_updates() -> None:
    ours, theirs = _train_state(), _train_state()
    step = tc.jit(_checked_step, policy="alias")
    reference = jax.jit(checkify.checkify(_update))
    for x in _BATCHES:
        err, value = step(ours, x)
        want_err, (want, theirs["params"], theirs["opt"]) = reference(
            theirs["params"], theirs["opt"], x
        )
        theirs["steps"] = theirs["steps"] + 1
        assert err.get() == want_err.get()
        np.testing.assert_allclose(value, want)
        jax.tree.map(np.testing.assert_allclose, ours, theirs)
    assert "x is not finite" in (step(_train_state(), _BATCHES[1])[0].get() or "")
    with pytest.raises(checkify.JaxRuntimeError, match="x is not finite"):
        step(_train_state(), _BATCHES[1])[0].throw()


def test_checkify_inside_the_step_under_the_other_policies() -> None:
    # clone: jax.jit's own call, the caller's state left as it was (and reported);
    # strict: the unreturned update is its MutationError; a dict writes back what it names.
    x = _BATCHES[1]
    state = _train_state()
    with pytest.warns(tc.MutationWarning, match=r"state\['params'\]"):
        err, _ = tc.jit(_checked_step)(state, x)
    assert "x is not finite" in (err.get() or "")
    jax.tree.map(np.testing.assert_array_equal, state, _train_state())
    with pytest.raises(tc.MutationError, match=r"state\['params'\]"):
        tc.jit(_checked_step, policy="strict")(_train_state(), x)
    state = _train_state()
    err, _ = tc.jit(_checked_step, policy={"state": "alias", ...: "clone"})(state, x)
    assert "x is not finite" in (err.get() or "")
    np.testing.assert_array_equal(state["steps"], 1)


@pytest.mark.parametrize("policy", ["alias", "strict", {0: "alias", ...: "clone"}])
def test_checkify_around_an_in_place_step_says_how(policy: Any) -> None:
    state = _train_state()
    with pytest.raises(ValueError, match="checkify.checkify inside the alias step"):
        tc.jit(checkify.checkify(_mutating_step), policy=policy)(state, jnp.ones(3))
    jax.tree.map(np.testing.assert_array_equal, state, _train_state())
    with pytest.raises(ValueError, match="checkify.checkify inside the alias step"):
        checkify.checkify(tc.jit(_mutating_step, policy="alias"))(state, jnp.ones(3))
    jax.tree.map(np.testing.assert_array_equal, state, _train_state())
