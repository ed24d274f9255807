"""Discarded mutations are loud (docs/semantics.md, rule J4): a function run under ``clone``
that changes an input in place without returning it gets a ``MutationWarning`` naming the key
paths, once per trace, in ``jit``, ``call`` and every lifted transformation; configurable."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import treeclone as tc
from flax import nnx


def _discarded(run: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``run()``'s result and the text of each MutationWarning it issued."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in caught if issubclass(w.category, tc.MutationWarning)]


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(3, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear(x)


def _train_step(model: _Model, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array):
    """An nnx step as written for ``nnx.jit``: it updates model and optimizer in place and
    returns only the loss."""

    def loss_fn(m: _Model) -> jax.Array:
        return ((m(x) - y) ** 2).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def _nnx_setup() -> tuple[_Model, nnx.Optimizer, jax.Array, jax.Array]:
    model = _Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    x = jnp.arange(12.0).reshape(4, 3) / 10
    return model, optimizer, x, jnp.ones((4, 1))


def test_an_nnx_step_ported_without_a_policy_warns_that_it_trains_nothing() -> None:
    # The seam of issue 21, case 1: nnx.jit(step) replaced by treeclone.jit(step).
    model, optimizer, x, y = _nnx_setup()
    before = nnx.state(model, nnx.Param)
    step = tc.jit(_train_step)
    losses, texts = _discarded(lambda: [float(step(model, optimizer, x, y)) for _ in range(3)])
    # What clone does is jax.jit's: nothing reaches the caller, the loss stays constant ...
    assert losses[0] == losses[1] == losses[2]
    assert int(optimizer.step[...]) == 0
    jax.tree.map(np.testing.assert_array_equal, nnx.state(model, nnx.Param), before)
    # ... and now it says so, once (one trace), naming what was lost and what to do.
    assert len(texts) == 1, texts
    text = texts[0]
    assert text.startswith("_train_step changed its inputs in place without returning them")
    for path in ("model.linear.kernel.value", "model.linear.bias.value", "optimizer.step.value"):
        assert f"  {path}: replaced" in text
    assert "policy='alias'" in text
    # The policy the warning points to trains as nnx.jit does, without a warning.
    model_a, optimizer_a, *_ = _nnx_setup()
    model_n, optimizer_n, *_ = _nnx_setup()
    aliased = tc.jit(_train_step, policy="alias")
    ours, texts = _discarded(lambda: [float(aliased(model_a, optimizer_a, x, y)) for _ in range(3)])
    theirs = [float(nnx.jit(_train_step)(model_n, optimizer_n, x, y)) for _ in range(3)]
    assert texts == [] and ours == pytest.approx(theirs) and ours[0] > ours[2]
    assert int(optimizer_a.step[...]) == int(optimizer_n.step[...]) == 3


def test_call_warns_too_and_the_caller_is_untouched() -> None:
    model, optimizer, x, y = _nnx_setup()
    _, texts = _discarded(lambda: tc.call(_train_step, model, optimizer, x, y))
    assert len(texts) == 1 and "optimizer.step.value: replaced" in texts[0]
    assert int(optimizer.step[...]) == 0


def _bump(d: dict) -> jax.Array:
    d["n"] = d["n"] + 1
    return jnp.sum(d["n"])


def _new_bump() -> Callable[[dict], jax.Array]:
    """A function of its own: JAX's caches (and so the warnings, once per trace) are per
    function, and ``_bump`` may have been traced by another test already."""

    def bump(d: dict) -> jax.Array:
        return _bump(d)

    return bump


def _state() -> dict:
    return {"n": jnp.zeros(2)}


# Each lifted transformation under clone, with a function that changes its dict argument
# (or carry, or slice) in place and does not return it; the path it names.
_TRANSFORMS: dict[str, tuple[Callable[[dict], Any], str]] = {
    "grad": (lambda s, b=_new_bump: tc.grad(b())(s), "d['n']"),
    "value_and_grad": (lambda s, b=_new_bump: tc.value_and_grad(b())(s), "d['n']"),
    "vmap": (lambda s, b=_new_bump: tc.vmap(b())(s), "d['n']"),
    "checkpoint": (lambda s, b=_new_bump: tc.checkpoint(b())(s), "d['n']"),
    "cond": (lambda s, b=_new_bump: tc.cond(True, b(), b(), s), "d['n']"),
    "switch": (lambda s, b=_new_bump: tc.switch(1, [b(), b()], s), "d['n']"),
    "scan_slice": (
        lambda s, b=_new_bump: tc.scan(
            lambda c, x: (c + b()(x), None), 0.0, {"n": jnp.ones((3, 2))}
        ),
        "x['n']",
    ),
    "while_loop_cond": (
        lambda s, b=_new_bump: tc.while_loop(lambda c: b()(c) < 0, lambda c: c, s),
        "c['n']",
    ),
    "fori_loop_new_carry": (
        lambda s, b=_new_bump: tc.fori_loop(0, 2, lambda i, c: (b()(c), {"n": c["n"] * 2})[1], s),
        "c['n']",
    ),
    "jit": (lambda s, b=_new_bump: tc.jit(b())(s), "d['n']"),
}


@pytest.mark.parametrize("name", list(_TRANSFORMS))
def test_every_transformation_under_clone_warns_naming_the_path(name: str) -> None:
    run, path = _TRANSFORMS[name]
    state = _state()
    _, texts = _discarded(lambda: run(state))
    assert texts, f"{name}: no MutationWarning"
    assert f"  {path}: replaced" in texts[0], texts[0]
    np.testing.assert_array_equal(state["n"], jnp.zeros(2))  # clone: the caller untouched


def test_a_returned_change_or_a_pure_function_does_not_warn() -> None:
    def returned(d: dict) -> dict:
        d["n"] = d["n"] + 1
        d.setdefault("log", []).append(d["n"])
        return d

    def pure(d: dict) -> jax.Array:
        return d["n"] * 2

    def inner_returned(d: dict) -> tuple:
        d["sub"]["k"] = d["sub"]["k"] + 1
        return (d["sub"],)

    for f, arg in [(returned, _state()), (pure, _state()), (inner_returned, {"sub": {"k": 1.0}})]:
        _, texts = _discarded(lambda f=f, arg=arg: tc.jit(f)(arg))
        assert texts == [], (f.__name__, texts)
        _, texts = _discarded(lambda f=f, arg=arg: tc.call(f, arg))
        assert texts == [], (f.__name__, texts)


def test_once_per_trace_cached_calls_are_silent() -> None:
    step = tc.jit(_new_bump())
    _, texts = _discarded(lambda: [step(_state()) for _ in range(5)])
    assert len(texts) == 1
    _, texts = _discarded(lambda: step({"n": jnp.zeros(3)}))  # a new shape: a new trace
    assert len(texts) == 1


def test_names_the_dynamic_arguments_around_static_ones() -> None:
    def f(n: int, d: dict, *, scale: float, extra: dict) -> jax.Array:
        d["x"] = d["x"] * scale
        extra["y"] = 1.0
        return jnp.sum(d["x"]) * n

    jitted = tc.jit(f, static_argnums=0, static_argnames="scale")
    _, texts = _discarded(lambda: jitted(2, {"x": jnp.ones(2)}, scale=3.0, extra={}))
    assert len(texts) == 1
    assert "  d['x']: replaced" in texts[0]
    assert "  extra: key added: 'y'" in texts[0]


def test_modes_per_function_per_block_and_globally() -> None:
    # "off": as jax.jit; "error": the MutationError strict raises, the caller untouched.
    state = _state()
    _, texts = _discarded(lambda: tc.jit(_bump, discarded_mutations="off")(state))
    assert texts == []
    with pytest.raises(tc.MutationError, match=r"(?s)_bump changed its inputs.*  d\['n'\]"):
        tc.jit(_bump, discarded_mutations="error")(state)
    np.testing.assert_array_equal(state["n"], jnp.zeros(2))
    # A block wins over the function's choice (as `with treeclone.policy` does).
    with tc.discarded_mutations("error"), pytest.raises(tc.MutationError):
        tc.jit(lambda d: _bump(d), discarded_mutations="off")(_state())
    with tc.discarded_mutations("off"):
        _, texts = _discarded(lambda: tc.vmap(_bump)(_state()))
    assert texts == []
    # The global setting, for everything without a choice of its own.
    previous = tc.set_discarded_mutations("error")
    try:
        assert previous == "warn"
        with pytest.raises(tc.MutationError):
            tc.call(_bump, _state())
        _, texts = _discarded(
            lambda: tc.jit(lambda d: _bump(d), discarded_mutations="warn")(_state())
        )
        assert len(texts) == 1
    finally:
        tc.set_discarded_mutations(previous)
    with pytest.raises(ValueError, match="discarded_mutations must be one of"):
        tc.jit(_bump, discarded_mutations="loud")
    with pytest.raises(ValueError, match="discarded_mutations must be one of"):
        tc.set_discarded_mutations("never")


def test_the_warning_is_a_user_warning_that_filters_and_w_error_handle() -> None:
    assert issubclass(tc.MutationWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.MutationWarning)
        with pytest.raises(tc.MutationWarning):
            tc.jit(lambda d: _bump(d))(_state())
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.MutationWarning)
        warnings.filterwarnings("ignore", message=".*<lambda> changed", category=tc.MutationWarning)
        tc.jit(lambda d: _bump(d))(_state())  # ignored by its function's name


def test_the_warning_points_at_the_users_function() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tc.jit(bump := _new_bump())(_state())
    (warning,) = [w for w in caught if issubclass(w.category, tc.MutationWarning)]
    assert warning.filename == __file__
    assert warning.lineno == bump.__code__.co_firstlineno


def test_a_discard_preserve_policy_warns_naming_its_policy() -> None:
    state = _state()
    _, texts = _discarded(lambda: tc.jit(_bump, policy=tc.Policy("discard", "preserve"))(state))
    assert len(texts) == 1 and "Policy(mutations='discard'" in texts[0]
    assert "  d['n']: replaced" in texts[0]
    np.testing.assert_array_equal(state["n"], jnp.zeros(2))


def test_clone_results_are_still_jax_jits() -> None:
    # The wrapper that reports changes nothing JAX computes: the same values, the same jaxpr.
    state = {"n": jnp.arange(3.0), "log": []}

    def f(d: dict) -> tuple:
        d["log"].append(d["n"])
        return d["n"] * 2, len(d["log"])

    theirs = jax.jit(f)(copy.deepcopy(state))
    ours, texts = _discarded(lambda: tc.jit(f)(state))
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    assert state["log"] == [] and "  d['log']: list resized from 0 to 1" in texts[0]
    assert str(jax.make_jaxpr(tc.jit(f))(state)) == str(jax.make_jaxpr(jax.jit(f))(state))
