"""Every call-time rule of ``treeclone.jit``, over every kind of call that runs a jitted
function: the jitted call itself, ``jit_partial`` (its first argument bound), a traced stage
(``.trace(...)``) and a compiled one (``.lower(...).compile()``). Each kind goes through the one
native call (``_native.LeanCall``), so a rule holds for all of them or for none; each test is
differential: alias against the plain Python program on the same objects, the rest against
``jax.jit``. And a cached call runs no Python frame of treeclone's."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from helpers import assert_same_tree

KINDS = ("jit", "jit_partial", "traced", "compiled")
STEPS = 3


def make(
    kind: str,
    fun: Callable,
    policy: Any,
    first: Any,
    *rest: Any,
    static: dict | None = None,
    **options: Any,
) -> Any:
    """``call(first, *rest, **static)``: ``fun`` called as ``kind`` says, under ``policy``
    with jit's ``options``; the stages are made for these arguments (and the ``static`` keyword
    arguments), and ``jit_partial`` binds ``first`` (so every call must pass that same object
    first). Static keyword arguments go to the jitted calls only: a stage has its static values
    fixed, as jax.jit's have."""
    if kind == "jit_partial":
        partial = tc.jit_partial(fun, first, policy=policy, **options)

        def call_partial(bound: Any, *args: Any, **static: Any) -> Any:
            assert bound is first
            return partial(*args, **static)

        return call_partial
    jitted = tc.jit(fun, policy=policy, **options)
    if kind == "jit":
        return jitted
    traced = jitted.trace(first, *rest, **(static or {}))
    stage = traced if kind == "traced" else traced.lower().compile()
    return lambda *args, **static: stage(*args)


def _same(a: Any, b: Any) -> None:
    """The same structure, container types and key order, equal arrays, the same other
    leaves."""
    assert_same_tree(a, b, leaf_eq=_same_leaf)


def _same_leaf(x: Any, y: Any) -> bool:
    if isinstance(x, jax.Array | np.ndarray | float | int):
        return np.allclose(np.asarray(x), np.asarray(y))
    return x is y or x == y


def _same_as_jax(a: Any, b: Any) -> None:
    """The same structure and equal arrays, as JAX sees them (a dict's key order aside:
    jax.jit's results have sorted keys)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert jax.tree.all(jax.tree.map(lambda x, y: np.allclose(x, y), a, b))


def _step(state: dict, x: jax.Array) -> jax.Array:
    state["w"] = state["w"] - 0.5 * x
    state["n"] = state["n"] + 1
    state["log"] = state["log"] * 0.9 + (state["w"] * x).sum()
    return (state["w"] ** 2).sum()


def _state() -> dict:
    return {"w": jnp.arange(3.0), "n": jnp.zeros((), jnp.int32), "log": jnp.zeros(())}


@pytest.mark.parametrize("kind", KINDS)
def test_alias_writes_back_as_the_plain_program_does(kind: str) -> None:
    state, plain = _state(), _state()
    call = make(kind, _step, "alias", state, jnp.ones(3))
    for i in range(STEPS):
        x = jnp.full(3, float(i))
        _same(call(state, x), _step(plain, x))
        _same(state, plain)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", ["strict", "clone"])
def test_a_policy_block_never_lets_an_alias_function_write_unseen(kind: str, block: str) -> None:
    """Inside ``with treeclone.policy("strict")`` (or ``"clone"``) an alias function's call
    does what the block says: the jitted call traces under it (strict: the MutationError of an
    unreturned change; clone: jax.jit's call, the change dropped with a MutationWarning), a
    jit_partial refuses clone, and a stage, whose write-back is compiled in, refuses to run
    under another policy. Never a silent write into the caller's objects."""
    state = _state()
    call = make(kind, _step, "alias", state, jnp.ones(3))
    before = copy.copy(state)
    with tc.policy(block):
        if kind == "jit" and block == "clone":
            with pytest.warns(tc.MutationWarning):
                call(state, jnp.ones(3))
        else:
            with pytest.raises(ValueError) as info:
                call(state, jnp.ones(3))
            if kind == "jit" and block == "strict":
                assert isinstance(info.value, tc.MutationError)
            elif kind in ("traced", "compiled"):
                assert "traced under policy" in str(info.value)
    assert all(state[k] is before[k] for k in before)  # nothing written
    _same(call(state, jnp.ones(3)), _step(_state(), jnp.ones(3)))  # outside: alias again


@pytest.mark.parametrize("kind", KINDS)
def test_donated_state_is_deleted_as_jax_jit_deletes_it(kind: str) -> None:
    """``donate_argnums=0``: the arrays the caller's state held before the call are deleted (as
    under jax.jit with donation), the state holds the new ones, and the results are jax.jit's."""

    def pure(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
        state = dict(state)
        loss = _step(state, x)
        return state, loss

    reference = jax.jit(pure, donate_argnums=0)
    theirs = _state()
    state = _state()
    call = make(kind, _step, "alias", state, jnp.ones(3), donate_argnums=0)
    for i in range(STEPS):
        x = jnp.full(3, float(i))
        old = dict(state)
        theirs, want = reference(theirs, x)
        got = call(state, x)
        _same_as_jax(got, want)
        _same_as_jax(state, theirs)
        # Donated, as by jax.jit's call and its compiled stage (its traced stage's call runs
        # the jaxpr, donating nothing).
        assert all(old[k].is_deleted() == (kind != "traced") for k in old)
        assert not any(state[k].is_deleted() for k in state)


@pytest.mark.parametrize("kind", KINDS)
def test_static_leaves_under_traced_arrays_are_handed_over_as_they_are(kind: str) -> None:
    def apply(model: dict, x: jax.Array) -> tuple[jax.Array, str]:
        model["w"] = model["w"] * model["scale"]
        model["calls"] = model["calls"] + [model["name"]]
        return model["activation"](x * model["w"]), model["name"]

    def model() -> dict:
        return {"w": jnp.ones(2), "scale": 2.0, "activation": jnp.tanh, "name": "mlp", "calls": []}

    ours, plain = model(), model()
    call = make(kind, apply, "alias", ours, jnp.ones(2), traced="arrays")
    for _ in range(STEPS if kind in ("jit", "jit_partial") else 1):
        _same(call(ours, jnp.ones(2)), apply(plain, jnp.ones(2)))
        _same(ours, plain)
        assert ours["activation"] is jnp.tanh


def _scaled(state: dict, x: jax.Array, *, n: int) -> jax.Array:
    state["w"] = state["w"] * n + x
    return state["w"].sum()


@pytest.mark.parametrize("kind", KINDS)
def test_static_arguments_are_taken_out(kind: str) -> None:
    traces = []

    def step(state: dict, x: jax.Array, *, n: int) -> jax.Array:
        traces.append(n)
        return _scaled(state, x, n=n)

    state, plain = _state(), _state()
    call = make(kind, step, "alias", state, jnp.ones(3), static={"n": 3}, static_argnames="n")
    for _ in range(STEPS):
        _same(call(state, jnp.ones(3), n=3), _scaled(plain, jnp.ones(3), n=3))
        _same(state, plain)
    assert traces == [3]


@pytest.mark.parametrize("kind", KINDS)
def test_in_shardings_give_what_jax_jit_gives(kind: str) -> None:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def pure(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
        state = dict(state)
        return state, _step(state, x)

    reference = jax.jit(pure, in_shardings=(sharding, sharding))
    # Committed from the start (the state keeps its placement), as a stage's key says.
    theirs, state = jax.device_put(_state(), sharding), jax.device_put(_state(), sharding)
    x = jax.device_put(jnp.ones(3), sharding)
    call = make(kind, _step, "alias", state, x, in_shardings=(sharding, sharding))
    for i in range(STEPS):
        x = jax.device_put(jnp.ones(3) * i, sharding)
        theirs, want = reference(theirs, x)
        _same_as_jax(call(state, x), want)
        _same_as_jax(state, theirs)
        assert state["w"].sharding == theirs["w"].sharding
    with pytest.raises(ValueError, match="kwargs when in_shardings"):
        tc.jit(_step, policy="alias", in_shardings=(sharding, sharding))(state, x=jnp.ones(3))


@pytest.mark.parametrize("kind", ["jit", "jit_partial"])
def test_an_outside_object_written_inside_a_transformation_is_refused(kind: str) -> None:
    """Rule J31: inside ``jax.jit`` (or grad) an alias call that would leave the outer trace's
    tracer in an object from outside raises before anything is written."""
    outside = _state()
    call = make(kind, _step, "alias", outside, jnp.ones(3))
    before = dict(outside)
    with pytest.raises(ValueError, match=r"would write a traced value of it into state\["):
        jax.jit(lambda x: call(outside, x))(jnp.ones(3))
    assert all(outside[k] is before[k] for k in before)


# --- a cached call runs no Python frame of treeclone's -------------------------------------------

PACKAGE = str(Path(tc.__file__).resolve().parent)


def treeclone_frames(call: Callable[[], Any]) -> list[str]:
    """The Python functions of treeclone's own package that ``call()`` runs."""
    found: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and str(Path(frame.f_code.co_filename).resolve()).startswith(PACKAGE):
            found.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return found


def _returns_state(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
    return state, _step(state, x)


def _hands_back(state: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x, state["w"] * 2  # strict hands the input back as jax.jit's array: x itself


CONFIGURATIONS: dict[str, tuple[Callable, dict]] = {
    "alias": (_step, {"policy": "alias"}),
    "strict": (_returns_state, {"policy": "strict"}),
    "strict, an input handed back": (_hands_back, {"policy": "strict"}),
    "per-argument": (_step, {"policy": {"state": "alias", ...: "strict"}}),
    "donated": (_step, {"policy": "alias", "donate_argnums": 0}),
    "traced=arrays": (_step, {"policy": "alias", "traced": "arrays"}),
    "traced=clone": (_returns_state, {"traced": "arrays"}),
    "static": (_step, {"policy": "alias", "static_argnames": "x"}),
    "in_shardings": (_step, {"policy": "alias", "in_shardings": None}),
}


@pytest.mark.parametrize("configuration", list(CONFIGURATIONS))
def test_a_cached_call_runs_no_python_frame_of_treeclone(configuration: str) -> None:
    fun, options = CONFIGURATIONS[configuration]
    if configuration == "in_shardings":
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        options = {**options, "in_shardings": (sharding, sharding)}
    x: Any = 2.0 if configuration == "static" else jnp.ones(3)
    jitted = tc.jit(fun, **options)
    state = _state()
    for _ in range(2):  # traced, compiled, cached (in_shardings: for the committed state too)
        out = jitted(state, x)
        if configuration in ("strict", "traced=clone"):
            state = out[0]
    assert treeclone_frames(lambda: jitted(state, x)) == []


@pytest.mark.parametrize("kind", ["traced", "compiled"])
@pytest.mark.parametrize("configuration", list(CONFIGURATIONS))
def test_a_stage_call_runs_no_python_frame_of_treeclone(kind: str, configuration: str) -> None:
    """Calling a traced or compiled stage is the jitted call with the stage computing, in the
    same native call (``rust/call/stage.rs``)."""
    fun, options = CONFIGURATIONS[configuration]
    if configuration == "in_shardings":
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        options = {**options, "in_shardings": (sharding, sharding)}
    x: Any = 2.0 if configuration == "static" else jnp.ones(3)
    state = _state()
    if configuration == "in_shardings":  # as the arrays written back are: committed
        state = jax.device_put(state, jax.devices()[0])
    traced = tc.jit(fun, **options).trace(state, x)
    stage = traced if kind == "traced" else traced.lower().compile()
    rest = () if configuration == "static" else (x,)  # a stage takes the dynamic arguments
    for _ in range(2):
        out = stage(state, *rest)
        if configuration in ("strict", "traced=clone"):
            state = out[0]
    assert treeclone_frames(lambda: stage(state, *rest)) == []


def test_a_cached_call_under_a_policy_block_runs_no_python_frame_of_treeclone() -> None:
    jitted = tc.jit(_returns_state, policy="alias")
    state = _state()
    with tc.policy("strict"):
        state = jitted(state, jnp.ones(3))[0]
        assert treeclone_frames(lambda: jitted(state, jnp.ones(3))) == []


def _bound_step(state: dict, x: jax.Array, *, scale: float = 1.0) -> jax.Array:
    return _step(state, x * scale)


def _nnx_model() -> Any:
    from flax import nnx

    class Counted(nnx.Module):
        def __init__(self) -> None:
            self.linear = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
            self.calls = nnx.Variable(jnp.zeros((), jnp.int32))

    return Counted()


def _nnx_step(model: Any, x: jax.Array) -> jax.Array:
    model.calls[...] = model.calls[...] + 1
    model.linear.bias[...] = model.linear.bias[...] - 0.1 * x
    return model.linear(x).sum()


@pytest.mark.parametrize("donate", [False, True])
def test_a_cached_call_with_an_nnx_model_runs_no_python_frame_of_treeclone(donate: bool) -> None:
    """The same nnx model call after call: its flatten is kept between calls (rule J32), and
    a call that uses it (the snapshot checked, the leaves joined, the write-back followed)
    runs no Python frame of treeclone's either."""
    jitted = tc.jit(_nnx_step, policy="alias", donate_argnums=0 if donate else None)
    model, x = _nnx_model(), jnp.ones(3)
    for _ in range(3):  # traced, compiled; met again, so kept
        jitted(model, x)
    assert treeclone_frames(lambda: jitted(model, x)) == []
    if tc._native.cpython_internals()[0] == "on":
        assert jitted._kept() is not None


PARTIAL_CONFIGURATIONS: dict[str, tuple[Callable, Callable[[], Any], dict, dict]] = {
    "alias": (_step, _state, {"policy": "alias"}, {}),
    "strict": (_returns_state, _state, {"policy": "strict"}, {}),
    "donated": (_step, _state, {"policy": "alias", "donate_argnums": 0}, {}),
    "keywords": (_bound_step, _state, {"policy": "alias"}, {"scale": jnp.ones(()), "z": 1}),
    "static": (_bound_step, _state, {"policy": "alias", "static_argnames": "scale"}, {"scale": 2}),
    "nnx": (_nnx_step, _nnx_model, {"policy": "alias"}, {}),
}


@pytest.mark.parametrize("configuration", list(PARTIAL_CONFIGURATIONS))
def test_a_cached_jit_partial_call_runs_no_python_frame_of_treeclone(configuration: str) -> None:
    """jit_partial's bound arguments are joined with the call's own and followed through the
    write-back natively (``rust/call/bound_args.rs``): a cached call runs no Python frame of
    treeclone's, whether its bound containers are written in place or not."""
    fun, make_state, options, kwargs = PARTIAL_CONFIGURATIONS[configuration]
    if configuration == "keywords":
        fun = lambda state, x, *, scale, z: _bound_step(state, x, scale=scale * z)  # noqa: E731
    bound = tc.jit_partial(fun, make_state(), **options)
    x = jnp.ones(3)
    for _ in range(3):  # traced, compiled, cached
        bound(x, **kwargs)
    assert treeclone_frames(lambda: bound(x, **kwargs)) == []


@pytest.mark.parametrize("kind", ["traced", "compiled"])
def test_a_jit_partial_stage_call_runs_no_python_frame_of_treeclone(kind: str) -> None:
    bound = tc.jit_partial(_step, _state(), policy="alias")
    x = jnp.ones(3)
    traced = bound.trace(x)
    stage = traced if kind == "traced" else traced.lower().compile()
    for _ in range(2):
        stage(x)
    assert treeclone_frames(lambda: stage(x)) == []
