"""The native call of ``treeclone.jit`` and ``jit_partial`` (``_native.LeanCall``, the one
call path) against the plain Python program on the same calls: the same results, the same
writes into the caller's objects, one trace per structure; and what it must not do: keep a
wrapper alive, lose the naming of a bad argument, hold arrays past their time."""

from __future__ import annotations

import copy
import gc
import sys
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from helpers import assert_same_tree

POLICIES = ("alias", "strict")


def _step(state: dict, x: Any, *, scale: Any, shift: Any) -> Any:
    state["w"] = state["w"] * scale + x
    state["hist"].append(shift)
    state["pair"] = (state["pair"][1], state["pair"][0])
    return state["w"].sum(), state


def _state() -> dict:
    shared = jnp.arange(2.0)
    return {"w": jnp.ones(3), "hist": [], "pair": (shared, shared), "n": 2}


def _same(a: Any, b: Any) -> None:
    """The same structure, container types and key order, and equal arrays."""
    assert_same_tree(a, b, leaf_eq=lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)))


def _same_as_jax(a: Any, b: Any) -> None:
    """The same structure as JAX sees it (a dict's key order aside) and equal leaves."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert jax.tree.all(jax.tree.map(lambda x, y: np.array_equal(x, y), a, b))


def _plain_copy(tree: Any) -> Any:
    """The caller's objects as the plain program gets them: copies of the containers (of the
    same types, in the same order, sharing what they share) holding the same arrays (which
    nothing changes in place)."""
    memo: dict[int, Any] = {}

    def copy_of(x: Any) -> Any:
        if id(x) not in memo:
            if isinstance(x, dict):
                memo[id(x)] = {k: copy_of(v) for k, v in x.items()}
            elif isinstance(x, list | tuple):
                memo[id(x)] = type(x)(copy_of(v) for v in x)
            else:
                memo[id(x)] = x
        return memo[id(x)]

    return copy_of(tree)


@pytest.mark.parametrize("policy", POLICIES)
def test_native_calls_give_what_the_plain_program_gives(policy: str) -> None:
    traces = []

    def step(state, x, *, scale, shift):
        traces.append(1)
        return _step(state, x, scale=scale, shift=shift)

    state = _state()
    jitted = tc.jit(step, policy=policy)
    for i in range(3):
        x = jnp.full(3, float(i))
        plain = _plain_copy(state)  # the caller's objects before the call
        plain_out = _step(plain, x, scale=2.0, shift=jnp.ones(()))
        # Keyword order is not part of a call's structure.
        out = jitted(state, x, shift=jnp.ones(()), scale=2.0)
        if policy == "alias":  # written back as the plain program writes
            _same(out, plain_out)
            _same(state, plain)
            assert out[1] is state
        else:  # the state returned is made anew (as jax.jit makes it: keys sorted)
            _same_as_jax(out, plain_out)
        assert state["pair"][0] is state["pair"][1]  # the shared leaf stays one object
    # One trace per structure: under alias the caller's list grows at each call (three
    # structures); strict writes nothing back (one).
    assert len(traces) == (3 if policy == "alias" else 1)


@pytest.mark.parametrize("policy", POLICIES)
def test_jit_partial_lean_calls_follow_the_bound_state(policy: str) -> None:
    def step(state, x):
        state["w"] = state["w"] + x
        return state["w"], state  # returned: strict's rule is kept

    state, reference = {"w": jnp.zeros(2)}, {"w": np.zeros(2)}
    bound = tc.jit_partial(step, state, policy="alias" if policy == "alias" else "strict")
    for i in range(3):
        out, _ = bound(jnp.full(2, float(i)))
        if policy == "alias":  # written back into the bound state
            reference["w"] = reference["w"] + i
        np.testing.assert_array_equal(out, reference["w"] + (0 if policy == "alias" else i))
        np.testing.assert_array_equal(state["w"], reference["w"])
    state["w"] = jnp.full(2, 10.0)  # changed outside between calls: seen
    np.testing.assert_array_equal(bound(jnp.ones(2))[0], np.full(2, 11.0))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("partial", [False, True])
# Unhashable options: the inner function is the wrapper's own and holds fun strongly.
@pytest.mark.parametrize("options", [{}, {"compiler_options": {}}])
def test_a_function_holding_its_own_wrapper_is_collected(
    policy: str, partial: bool, options: dict
) -> None:
    # fun -> its closure -> the wrapper -> its LeanCall -> the inner function -> fun: a cycle
    # the garbage collector must see through (LeanCall.__traverse__).
    def make():
        holder: dict[str, Any] = {}

        def f(x):
            holder["wrapper"]  # noqa: B018 - a reference to the wrapper, through the closure
            return x * 2

        make = tc.jit_partial if partial else tc.jit
        wrapper = make(f, policy=policy, **options)
        holder["wrapper"] = wrapper
        wrapper(jnp.ones(2))
        return weakref.ref(f), weakref.ref(wrapper)

    refs = make()
    gc.collect()
    assert [r() for r in refs] == [None, None]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_cyclic_argument_is_named_on_the_lean_path(policy: str) -> None:
    cfg: dict[str, Any] = {"x": jnp.ones(2)}
    cfg["self"] = cfg
    with pytest.raises(ValueError, match=r"the dict at cfg contains itself"):
        tc.jit(lambda cfg: cfg["x"], policy=policy)(cfg)
    bound = tc.jit_partial(lambda s, cfg: s["w"], {"w": jnp.ones(2)}, policy=policy)
    with pytest.raises(ValueError, match=r"the dict at cfg contains itself"):
        bound(cfg)
    np.testing.assert_array_equal(bound({"x": 1.0}), np.ones(2))  # and it stays usable


def test_a_call_inside_a_jax_transformation_takes_the_checked_end() -> None:
    # Alias inside jax.grad: the outputs are tracers, so the lean call finishes in Python,
    # where rule J31's check runs (an object from outside the transformation is refused).
    outside = {"w": jnp.ones(())}

    def bump(state, x):
        state["w"] = state["w"] * x
        return x

    jitted = tc.jit(bump, policy="alias")
    with pytest.raises(ValueError, match="Nothing was written"):
        jax.grad(lambda x: jitted(outside, x))(2.0)
    np.testing.assert_array_equal(outside["w"], 1.0)
    inside = copy.copy(outside)
    assert jax.grad(lambda x: jitted({"w": x}, x))(3.0) == 1.0
    assert inside["w"] == 1.0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("static_argnums", [(1,), (-2,)])
def test_static_arguments_are_taken_out_as_the_plain_program_sees_them(
    policy: str, static_argnums: tuple
) -> None:
    traces = []

    def plain_step(state, n, x, *, mode, scale):
        state["w"] = state["w"] * scale + x * n
        return (state["w"].sum() if mode == "sum" else state["w"].max()), state

    def step(state, n, x, *, mode, scale):
        traces.append((n, type(n), mode))
        return plain_step(state, n, x, mode=mode, scale=scale)

    jitted = tc.jit(step, policy=policy, static_argnums=static_argnums, static_argnames=("mode",))
    state = {"w": jnp.ones(3)}
    # 2 and 2.0 are equal but trace apart (jax.jit keys a static value with its type).
    for n, mode in [(2, "sum"), (2, "sum"), (2.0, "sum"), (2, "max")]:
        x = jnp.arange(3.0)
        plain = _plain_copy(state)
        plain_out = plain_step(plain, n, x, mode=mode, scale=jnp.ones(()))
        out = jitted(state, n, x, scale=jnp.ones(()), mode=mode)
        _same_as_jax(out, plain_out)
        if policy == "alias":
            _same(state, plain)
    assert traces == [(2, int, "sum"), (2.0, float, "sum"), (2, int, "max")]
    with pytest.raises(ValueError, match="Non-hashable static arguments"):  # jax.jit's text
        jitted(state, [2], jnp.ones(3), scale=1.0, mode="sum")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_keyword_dict_passed_along_is_the_calls_own(policy: str) -> None:
    # f(d, **d) hands the caller's own dict to the native __call__; as with a Python
    # function's **kwargs, the call's keywords are a dict of its own, not shared with d.
    traces = []

    def f(d, **kw):
        traces.append(1)
        d["a"] = d["a"] + 1
        return kw["a"], d

    d = {"a": jnp.zeros(())}
    jitted = tc.jit(f, policy=policy)
    out, _ = jitted(d, **d)
    out_again, _ = jitted(d, **dict(d))
    assert len(traces) == 1
    assert float(out) == 0.0
    if policy == "alias":
        assert float(out_again) == 1.0 and float(d["a"]) == 2.0


# --- the last calls' leaves, held three calls (HOLD_INPUT_PLATFORMS, _BYTES) -------------------

_JIT_MODULE = sys.modules["treeclone._jit.inner"]  # where the inner jit decides it


def _fresh(n: int = 3) -> Any:
    return jnp.arange(float(n)) + 1.0  # an array no one else holds


@pytest.fixture
def holding_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean path holds leaves on the CPU too, where these tests run (read at trace time)."""
    monkeypatch.setattr(_JIT_MODULE, "HOLD_INPUT_PLATFORMS", frozenset({"cpu", "tpu"}))


@pytest.mark.parametrize("policy", POLICIES)
def test_on_the_cpu_the_last_calls_leaves_go_at_once(policy: str) -> None:
    # On the CPU holding them measured either way (benches/release_probe.py): not held there.
    # The array is put on the CPU so that the claim is checked whatever the default backend
    # (on a TPU the leaves are held: the next test).
    assert "cpu" not in _JIT_MODULE.HOLD_INPUT_PLATFORMS
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:
        pytest.skip("no CPU backend: JAX_PLATFORMS leaves it out")
    f = tc.jit(lambda x: x * 3, policy=policy)
    a = jax.device_put(_fresh(), cpu)
    old = weakref.ref(a)
    f(a)
    del a
    gc.collect()
    assert old() is None


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.usefixtures("holding_on_cpu")
def test_the_last_calls_leaves_are_held_for_three_calls(policy: str, partial: bool) -> None:
    # A training loop lets its old state go right after the call that reads it; the native
    # call lets it go three calls later (when that computation is most likely done), as the
    # harness's floor holds its arrays on the TPU, not later.
    if partial:
        f = tc.jit_partial(lambda s, x: s["w"] * x, {"w": jnp.ones(3)}, policy=policy)
    else:
        f = tc.jit(lambda x: x * 2, policy=policy)
    a = _fresh()
    old = weakref.ref(a)
    np.testing.assert_array_equal(f(a), np.asarray(a) * (1 if partial else 2))
    del a
    for _ in range(2):
        gc.collect()
        assert old() is not None  # held
        f(_fresh())
    gc.collect()
    assert old() is not None  # still held, two calls later
    f(_fresh())
    gc.collect()
    assert old() is None  # let go at the third call after it


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.usefixtures("holding_on_cpu")
def test_clear_cache_lets_the_held_leaves_go(policy: str) -> None:
    f = tc.jit(lambda x: x + 1, policy=policy)
    a = _fresh()
    old = weakref.ref(a)
    f(a)
    del a
    f.clear_cache()
    gc.collect()
    assert old() is None


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.usefixtures("holding_on_cpu")
def test_arguments_over_the_hold_limit_are_let_go_at_once(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_JIT_MODULE, "HOLD_INPUT_BYTES", 8)
    f = tc.jit(lambda x: x - 1, policy=policy)
    small, large = jnp.ones(2), _fresh(3)  # float32: 8 bytes, held; 12 bytes, not
    f(small)  # traced at the limit: held
    small_ref, large_ref = weakref.ref(small), weakref.ref(large)
    del small
    gc.collect()
    assert small_ref() is not None
    f(large)  # another trace, over the limit: holds nothing, lets the last leaves go
    del large
    gc.collect()
    assert (small_ref(), large_ref()) == (None, None)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.usefixtures("holding_on_cpu")
def test_a_held_leaf_let_go_may_call_the_function_again(policy: str) -> None:
    # Releasing the held leaves runs their finalizers: one that calls the same function finds
    # nothing locked (the lean path lets them go after its lock).
    calls: list[Any] = []

    class Dying(np.ndarray):
        def __del__(self) -> None:
            calls.append(np.asarray(f(np.zeros(2, np.float32))))

    f = tc.jit(lambda x: x + 1, policy=policy)
    f(np.ones(2, np.float32).view(Dying))
    gc.collect()
    assert calls == []  # held
    for _ in range(3):  # the third lets the Dying one go: its finalizer calls f
        f(np.ones(2, np.float32))
    gc.collect()
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0], np.ones(2))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.usefixtures("holding_on_cpu")
def test_no_tracer_is_held_past_a_transformation(policy: str) -> None:
    # Inside a JAX transformation the leaves are its tracers: held, they would outlive it.
    f = tc.jit(lambda x: x * 2, policy=policy)
    f(_fresh())  # traced on arrays: held from then on
    with jax.checking_leaks():
        np.testing.assert_array_equal(jax.jit(lambda x: f(x).sum())(_fresh()), 12.0)
        np.testing.assert_array_equal(jax.grad(lambda x: f(x).sum())(_fresh()), np.full(3, 2.0))
