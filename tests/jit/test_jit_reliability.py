"""Reliability of ``treeclone.jit`` where adversarial users found it differing from ``jax.jit``.

Each test states its rule in its name and, where the rule is "as ``jax.jit`` does", runs the
same call under ``jax.jit`` and compares. ``jax.jit`` shares its trace cache between wrappers of
one function, so the functions whose traces are counted are made fresh for each run.
"""

from __future__ import annotations

import gc
import pickle
import re
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from helpers import capture, check_same_error
from treeclone._lift import argument_names

POLICIES = ("clone", "alias", "strict")
# Where the inner jits of every treeclone.jit are kept, and where a call is taken apart.
OPTIONS_MODULE = sys.modules["treeclone._jit.options"]
CALL_MODULE = sys.modules["treeclone._jit.call"]


def jit_of(kind: str) -> Callable[..., Any]:
    """``jax.jit`` for ``"jax"``, else ``treeclone.jit`` with that policy."""
    if kind == "jax":
        return jax.jit
    return lambda fun, **kwargs: tc.jit(fun, policy=kind, **kwargs)


def leaves_close(actual: Any, expected: Any) -> None:
    a_leaves, a_def = jax.tree_util.tree_flatten(actual)
    e_leaves, e_def = jax.tree_util.tree_flatten(expected)
    assert a_def == e_def
    for a, e in zip(a_leaves, e_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e))


# --- 1. in_shardings=None is no in_shardings ---------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("option", ["in_shardings", "out_shardings"])
def test_in_shardings_none_accepts_keyword_arguments(policy: str, option: str) -> None:
    """flax's nnx.jit always passes in_shardings (None when not given): jax.jit takes None as
    not given, so keyword arguments are fine."""

    def f(x, y):
        return x * 2 + y["b"]

    x, y = jnp.arange(3.0), {"b": jnp.ones(3)}
    expected = jax.jit(f, **{option: None})(x, y=y)
    leaves_close(tc.jit(f, policy=policy, **{option: None})(x, y=y), expected)
    leaves_close(tc.jit(f, policy=policy, **{option: None})(x=x, y=y), expected)


@pytest.mark.parametrize("policy", POLICIES)
def test_in_shardings_given_rejects_keyword_arguments_as_jax_jit_does(policy: str) -> None:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def f(x, y):
        return x + y

    x = jnp.arange(3.0)
    check_same_error(
        lambda: tc.jit(f, policy=policy, in_shardings=sharding)(x, y=x),
        lambda: jax.jit(f, in_shardings=sharding)(x, y=x),
    )


# --- 2. the user's function object is never written to -------------------------------------------


class Scale:
    """A user's callable object: picklable, with state of its own."""

    def __init__(self, k: float) -> None:
        self.k = k

    def __call__(self, d: dict) -> dict:
        return {"w": d["w"] * self.k}


class Clashing:
    """A callable whose attributes have the names of treeclone's own internals."""

    def __init__(self) -> None:
        self._fun = "not a function"
        self._policy = "not a policy"
        self._kwargs = "not options"
        self._inner = "not a cache"

    def __call__(self, x):
        return x + 1


@pytest.mark.parametrize("policy", POLICIES)
def test_jit_never_writes_to_the_users_callable_object(policy: str) -> None:
    obj = Scale(2.0)
    before = dict(obj.__dict__)
    jitted = tc.jit(obj, policy=policy)
    assert obj.__dict__ == before
    pickle.dumps(obj)
    for p in POLICIES:
        out = jitted.with_policy(p)({"w": jnp.ones(2)})
        np.testing.assert_allclose(out["w"], 2.0)
    jitted.lower({"w": jnp.ones(2)})
    jitted.eval_shape({"w": jnp.ones(2)})
    assert obj.__dict__ == before
    assert pickle.loads(pickle.dumps(obj)).k == 2.0


@pytest.mark.parametrize("policy", POLICIES)
def test_jit_never_writes_to_the_users_function(policy: str) -> None:
    def f(x):
        return x * 2

    f.tag = "mine"
    jitted = tc.jit(f, policy=policy)
    jitted(jnp.ones(2))
    jitted.lower(jnp.ones(2))
    assert f.__dict__ == {"tag": "mine"}
    assert jitted.tag == "mine"  # copied onto the wrapper, as jax.jit's wrapper does


@pytest.mark.parametrize("policy", POLICIES)
def test_attributes_of_the_callable_do_not_replace_the_wrappers_internals(policy: str) -> None:
    jitted = tc.jit(Clashing(), policy=policy)
    assert jitted.policy.name == policy
    np.testing.assert_allclose(jitted(jnp.ones(2)), 2.0)
    np.testing.assert_allclose(jitted.with_policy("alias")(jnp.ones(2)), 2.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_jit_keeps_no_reference_to_the_function_once_the_wrapper_is_gone(policy: str) -> None:
    def make():
        def f(x):
            return x * 2

        return f

    f = make()
    ref = weakref.ref(f)
    jitted = tc.jit(f, policy=policy)
    jitted(jnp.ones(2))
    jitted.lower(jnp.ones(2))
    del f, jitted
    gc.collect()
    assert ref() is None
    assert all(entry[0]() is not None for entry in OPTIONS_MODULE._SHARED.values())


# --- 3. lower/trace/eval_shape, then a call: one trace --------------------------------------------


def _aot_case(count: list[int]) -> Callable[..., Any]:
    def f(d, x, n, *, scale):
        count.append(1)
        return {"y": d["w"] * n + x * scale, "x": x}

    return f


def _aot_args() -> tuple[tuple, dict]:
    return ({"w": jnp.arange(3.0)}, jnp.ones(3), 2), {"scale": 3.0}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("method", ["lower", "trace", "eval_shape"])
def test_ahead_of_time_then_call_traces_once_as_under_jax_jit(policy: str, method: str) -> None:
    runs = {}
    for kind in ("jax", policy):
        count: list[int] = []
        jitted = jit_of(kind)(_aot_case(count), static_argnums=2, donate_argnums=1)
        args, kwargs = _aot_args()
        stage = getattr(jitted, method)(*args, **kwargs)
        args, kwargs = _aot_args()
        out = jitted(*args, **kwargs)
        runs[kind] = (len(count), out, _computation(method, stage))
    assert runs[policy][0] == runs["jax"][0] == 1
    leaves_close(runs[policy][1], runs["jax"][1])
    assert runs[policy][2] == runs["jax"][2]


def _computation(method: str, stage: Any) -> Any:
    """What a stage computes, up to the order of its parameters (treeclone's call passes the
    donated leaves first): the operations, the outputs' names and the donated inputs."""
    if method == "eval_shape":
        return stage
    if method == "trace":
        jaxpr = stage.jaxpr
        avals = sorted(str(v.aval) for v in jaxpr.jaxpr.invars)
        return avals, [e.primitive.name for e in jaxpr.eqns], [str(a) for a in jaxpr.out_avals]
    text = stage.as_text()
    return (
        re.findall(r"stablehlo\.\w+", text),
        re.findall(r'jax\.result_info = "([^"]*)"', text),
        text.count("tf.aliasing_output"),
    )


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_lowered_computation_is_the_functions_own_and_writes_nothing_back(policy: str) -> None:
    def f(state, x):
        new = state["w"] + x
        return {"w": new}, new.sum()

    state = {"w": jnp.zeros(3)}
    compiled = tc.jit(f, policy=policy).lower(state, jnp.ones(3)).compile()
    expected = jax.jit(f).lower(state, jnp.ones(3)).compile()(state, jnp.ones(3))
    leaves_close(compiled(state, jnp.ones(3)), expected)
    np.testing.assert_allclose(state["w"], 0.0)


def test_lower_under_alias_then_call_writes_back_once() -> None:
    count: list[int] = []

    def f(state, x):
        count.append(1)
        state["w"] = state["w"] + x
        return state["w"].sum()

    jitted = tc.jit(f, policy="alias")
    state = {"w": jnp.zeros(3)}
    jitted.lower(state, jnp.ones(3))
    np.testing.assert_allclose(state["w"], 0.0)  # lowering writes nothing back
    jitted(state, jnp.ones(3))
    np.testing.assert_allclose(state["w"], 1.0)
    assert len(count) == 1


def test_lower_under_strict_reports_a_non_returned_mutation() -> None:
    """Lowering traces the function as the call would, so strict's check runs then."""

    def f(state):
        state["w"] = state["w"] + 1
        return state["w"].sum()

    with pytest.raises(tc.MutationError, match=r"state\['w'\]: replaced"):
        tc.jit(f, policy="strict").lower({"w": jnp.zeros(3)})


# --- 4. the donation mask is computed once per structure -----------------------------------------


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_donation_mask_is_computed_once_per_structure(monkeypatch, policy: str) -> None:
    computed = []
    real = CALL_MODULE.CallShape.keep_mask

    def counting(self, *args):
        computed.append(args)
        return real(self, *args)

    monkeypatch.setattr(CALL_MODULE.CallShape, "keep_mask", counting)

    def f(params, x, *, lr):
        return jax.tree_util.tree_map(lambda p: p - lr * x.sum(), params)

    jitted = tc.jit(f, policy=policy, donate_argnums=0)
    for _ in range(5):
        params = {"a": jnp.ones(3), "b": [jnp.ones(2), jnp.ones(2)]}
        x = jnp.ones(4)
        jitted(params, x, lr=0.1)
        assert params["a"].is_deleted() and not x.is_deleted()
    assert len(computed) == 1
    jitted.with_policy("strict" if policy == "alias" else "alias")(
        {"a": jnp.ones(3), "b": [jnp.ones(2), jnp.ones(2)]}, jnp.ones(4), lr=0.1
    )
    assert len(computed) == 1  # shared by the same function under another policy
    jitted({"a": jnp.ones(3)}, jnp.ones(4), lr=0.1)  # another structure
    assert len(computed) == 2


# --- 5. donation saves memory as under jax.jit --------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_donated_input_buffer_is_reused_by_the_output_as_under_jax_jit(policy: str) -> None:
    def run(kind: str) -> tuple[bool, bool]:
        x = jnp.arange(1000.0)
        pointer = x.unsafe_buffer_pointer()
        out = jit_of(kind)(lambda x: x + 1, donate_argnums=0)(x)
        np.testing.assert_allclose(out, np.arange(1000.0) + 1)
        return out.unsafe_buffer_pointer() == pointer, x.is_deleted()

    expected = run("jax")
    if not expected[0]:
        pytest.skip(f"jax.jit does not reuse donated buffers on {jax.default_backend()}")
    assert run(policy) == expected


def test_in_place_update_of_a_donated_container_reuses_its_buffers() -> None:
    """alias: the optimizer pattern (update the state in place, donate it) keeps one copy of
    the state, as ``state = jax.jit(step, donate_argnums=0)(state)`` does."""

    def step(state):
        state["w"] = state["w"] * 0.5

    state = {"w": jnp.arange(1000.0)}
    pointer = state["w"].unsafe_buffer_pointer()
    reference = jax.jit(lambda s: {"w": s["w"] * 0.5}, donate_argnums=0)({"w": jnp.arange(1000.0)})
    tc.jit(step, policy="alias", donate_argnums=0)(state)
    np.testing.assert_allclose(state["w"], np.arange(1000.0) * 0.5)
    assert not state["w"].is_deleted()
    if reference["w"].unsafe_buffer_pointer() is not None:
        assert state["w"].unsafe_buffer_pointer() == pointer


def _donation_warnings(kind: str, case: str) -> tuple[list[str], list[bool]]:
    # A new function each run: jax.jit compiles (and warns) once per function.
    fun, args = {
        "no_output_matches": (lambda x: jnp.sum(x), (jnp.arange(10.0),)),
        "dict_argument": (
            lambda d: d["a"] * 2 + d["b"].sum(),
            ({"a": jnp.ones(3), "b": jnp.ones(5)},),
        ),
        "list_argument": (
            lambda xs, y: xs[0] + y + xs[1].sum(),
            ([jnp.ones(3), jnp.ones(7)], jnp.ones(3)),
        ),
    }[case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jit_of(kind)(fun, donate_argnums=0)(*args)
    messages = [str(w.message) for w in caught if "donated" in str(w.message)]
    return messages, [x.is_deleted() for x in jax.tree_util.tree_leaves(args[0])]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", ["no_output_matches", "dict_argument", "list_argument"])
def test_unusable_donations_warn_and_stay_alive_as_under_jax_jit(policy: str, case: str) -> None:
    expected = _donation_warnings("jax", case)
    assert expected[0], "jax.jit did not warn"
    assert _donation_warnings(policy, case) == expected


# --- 6. jax's messages name the user's function, argument and key path --------------------------


class Pair(NamedTuple):
    a: Any
    b: Any


def _f_positional(d, y=None, *, z=None):
    return d


def _f_var(x, *rest, **extra):
    return x


def _f_two(a, b):
    return a


ARGUMENT_CASES = {
    "nested_dict": (_f_positional, {}, ({"cfg": {"name": "x"}},), {}),
    "list_in_dict": (_f_positional, {}, ({"a": [1.0, "s"]},), {}),
    "keyword": (_f_positional, {}, (jnp.ones(2),), {"y": {"k": "s"}}),
    "keyword_only": (_f_positional, {}, (jnp.ones(2),), {"z": ("s",)}),
    "namedtuple": (_f_positional, {}, (Pair(jnp.ones(2), object()),), {}),
    "var_positional": (_f_var, {}, (jnp.ones(2), 1.0, [jnp.ones(2), "s"]), {}),
    "var_keyword": (_f_var, {}, (jnp.ones(2),), {"extra_arg": {"k": "s"}}),
    "static_before": (_f_two, {"static_argnums": 0}, ("static", {"k": "s"}), {}),
    "donated_before": (_f_two, {"donate_argnums": 0}, (jnp.ones(2), {"k": "s"}), {}),
    "shared_array": (_f_two, {}, (jnp.ones(2), [jnp.ones(2), "s"]), {}),
    "whole_argument": (_f_two, {}, (jnp.ones(2), "s"), {}),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", sorted(ARGUMENT_CASES))
def test_non_array_argument_error_names_the_users_argument_and_key_path(policy, case) -> None:
    """jax.jit's TypeError, its text unchanged, then the remedy treeclone has for the leaf
    (``traced='arrays'``, tests/policies/test_messages.py)."""
    fun, options, args, kwargs = ARGUMENT_CASES[case]
    error = capture(lambda: jax.jit(fun, **options)(*args, **kwargs))
    assert isinstance(error, TypeError)
    ours = capture(lambda: tc.jit(fun, policy=policy, **options)(*args, **kwargs))
    assert type(ours) is TypeError
    text, theirs = str(ours), str(error)
    assert text.startswith(theirs + "\n"), f"{text!r} does not start with {theirs!r}"
    assert "traced='arrays'" in text[len(theirs) :]


def _bool_of_tracer(params, x):
    if params["w"] > 0:
        return x
    return -x


_doubled = tc.jit(lambda v: v * 2, policy="alias")


def _bool_after_a_nested_call(params, x):
    # A treeclone call traced inside this one leaves this call's naming in place after it.
    if _doubled(params["w"]) > 0:
        return x
    return -x


def _shape_from_tracer(x, *, n):
    return jnp.zeros(n) + x


def _invalid_output(d):
    return {"a": d["w"], "b": "not an array"}


TRACE_CASES = {
    "bool_of_tracer": (_bool_of_tracer, ({"w": jnp.ones(())}, jnp.ones(2)), {}),
    "bool_after_nested_call": (_bool_after_a_nested_call, ({"w": jnp.ones(())}, jnp.ones(2)), {}),
    "shape_from_tracer": (_shape_from_tracer, (jnp.ones(()),), {"n": jnp.int32(3)}),
    "invalid_output": (_invalid_output, ({"w": jnp.ones(2)},), {}),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_trace_time_errors_name_the_users_function_and_argument(policy, case) -> None:
    fun, args, kwargs = TRACE_CASES[case]
    check_same_error(
        lambda: tc.jit(fun, policy=policy)(*args, **kwargs),
        lambda: jax.jit(fun)(*args, **kwargs),
    )


# --- 7. MutationError names *args values by their index ------------------------------------------


def _mutates_rest(x, *rest, scale=1.0, **extra):
    rest[1]["w"] = rest[1]["w"] * scale
    extra["opt"]["n"] = 1.0
    return x


@pytest.mark.parametrize(
    ("options", "second"),
    [({}, {"a": 1.0}), ({"static_argnums": 1}, "static")],
    ids=["dynamic", "static_before"],
)
def test_mutation_error_names_var_positional_arguments_by_index(options, second) -> None:
    with pytest.raises(tc.MutationError) as info:
        tc.jit(_mutates_rest, policy="strict", **options)(
            jnp.ones(2), second, {"w": jnp.ones(2)}, scale=2.0, opt={"n": 0.0}
        )
    lines = str(info.value).splitlines()
    assert "  rest[1]['w']: replaced" in lines
    assert "  opt['n']: replaced" in lines
    assert "scale" not in str(info.value)


def test_call_mutation_error_names_var_positional_arguments_by_index() -> None:
    with pytest.raises(tc.MutationError, match=r"rest\[1\]\['w'\]: replaced"):
        tc.call(_mutates_rest, jnp.ones(2), {"a": 1.0}, {"w": jnp.ones(2)}, policy="strict", opt={})


def test_argument_names_follow_the_signature() -> None:
    def plain(a, b, /, c):
        pass

    def star(x, *rest, scale=1.0, **extra):
        pass

    assert argument_names(plain, range(4)) == ["a", "b", "c", "args[3]"]
    assert argument_names(star, range(4)) == ["x", "rest[0]", "rest[1]", "rest[2]"]
    assert argument_names(len, [0]) == ["obj"]
    assert argument_names(min, [0, 1]) == ["args[0]", "args[1]"]  # no signature
