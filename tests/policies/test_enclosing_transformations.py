"""Rule 25a: an alias call inside an enclosing JAX transformation never leaves a tracer of it
in a caller's object. Each case is checked against the plain Python program on NumPy copies
(what the caller's objects must hold) or against the error, with the caller untouched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from jax.core import Tracer


def _loss(w: Any, stats: dict) -> Any:
    """A loss that records an activation statistic in place (the issue's ``stats``)."""
    a = w * 2
    stats["act_mean"] = a.mean()
    return (a**2).sum()


def _stats() -> dict:
    return {"act_mean": jnp.zeros(())}


def _assert_untouched(stats: dict) -> None:
    assert not isinstance(stats["act_mean"], Tracer)
    np.testing.assert_array_equal(stats["act_mean"], 0.0)


_W = jnp.arange(3.0)
_WS = jnp.arange(6.0).reshape(2, 3)

# Around an alias call, each JAX transformation that hands the function the caller's own
# object (jax.grad's undifferentiated argument, a closure) or its own copy with concrete
# leaves (jax.vmap's unbatched argument): rule 25a's error.
_LEAKS: dict[str, Callable[[Callable, dict], Any]] = {
    "jax.grad": lambda loss, s: jax.grad(loss)(_W, s),
    "jax.vmap": lambda loss, s: jax.vmap(loss, in_axes=(0, None))(_WS, s),
    "jax.lax.scan": lambda loss, s: jax.lax.scan(lambda c, w: (c + loss(w, s), None), 0.0, _WS),
    "jax.jit": lambda loss, s: jax.jit(lambda w: loss(w, s))(_W),
    "jax.value_and_grad": lambda loss, s: jax.value_and_grad(loss)(_W, s),
}


@pytest.mark.parametrize("name", list(_LEAKS))
def test_an_alias_call_inside_a_jax_transformation_never_leaks_a_tracer(name: str) -> None:
    stats = _stats()
    loss = tc.jit(_loss, policy="alias")
    with pytest.raises(ValueError, match=r"(?s)inside a JAX transformation.*stats\['act_mean'\]"):
        _LEAKS[name](loss, stats)
    _assert_untouched(stats)  # nothing written: no tracer, no half-applied write


def test_without_the_check_jax_grad_would_leave_a_tracer_in_the_callers_dict() -> None:
    # What the error prevents: the plain Python program under jax.grad leaves the tracer.
    stats = _stats()
    jax.grad(_loss)(_W, stats)
    assert isinstance(stats["act_mean"], Tracer)


def _plain_stats(ws: np.ndarray) -> np.ndarray:
    """The statistic the plain Python program leaves, for each row of ``ws``."""
    return np.asarray([np.mean(np.asarray(w) * 2) for w in np.atleast_2d(ws)])


def test_treeclones_transformations_write_the_value_back_concrete() -> None:
    loss = tc.jit(_loss, policy="alias")
    # grad: stats is an undifferentiated argument, rebuilt and written back by treeclone.grad.
    stats = _stats()
    g = tc.grad(loss, policy="alias")(_W, stats)
    np.testing.assert_allclose(g, 8 * np.asarray(_W))
    assert not isinstance(stats["act_mean"], Tracer)
    np.testing.assert_allclose(stats["act_mean"], _plain_stats(_W)[0])
    # vmap: one statistic per example, stats mapped along axis 0.
    stats = {"act_mean": jnp.zeros(2)}
    tc.vmap(loss, in_axes=(0, 0), policy="alias")(_WS, stats)
    np.testing.assert_allclose(stats["act_mean"], _plain_stats(_WS))

    # scan: stats carried (not closed over): the last row's statistic, as the Python loop.
    def body(carry: tuple, w: Any) -> tuple:
        total, s = carry
        return (total + loss(w, s), s), None

    stats = _stats()
    (total, out), _ = tc.scan(body, (0.0, stats), _WS, policy="alias")
    assert out is stats
    np.testing.assert_allclose(stats["act_mean"], _plain_stats(_WS)[-1])
    # checkpoint and an enclosing alias jit: the object is an argument of the enclosing call.
    for outer in (tc.checkpoint(loss, policy="alias"), tc.jit(loss, policy="alias")):
        stats = _stats()
        outer(_W, stats)
        assert not isinstance(stats["act_mean"], Tracer)
        np.testing.assert_allclose(stats["act_mean"], _plain_stats(_W)[0])


def test_jax_checkpoint_drops_the_write_as_jax_does() -> None:
    # jax.checkpoint (like jax.jit's own arguments) hands the function copies holding its
    # tracers: the write goes into the copy, which JAX drops (docs/semantics.md, "JAX's own
    # transformations inside an alias step"); the caller keeps its value, never a tracer.
    stats = _stats()
    jax.checkpoint(tc.jit(_loss, policy="alias"))(_W, stats)
    _assert_untouched(stats)


def test_a_container_made_inside_the_transformation_is_filled() -> None:
    # An argument without leaves cannot be told apart from one made inside the enclosing
    # trace, which is what it usually is: it is written, as plain Python would.
    loss = tc.jit(_loss, policy="alias")

    def outer(w: Any) -> tuple:
        metrics: dict = {}
        return loss(w, metrics), metrics

    value, metrics = jax.jit(outer)(_W)
    np.testing.assert_allclose(metrics["act_mean"], _plain_stats(_W)[0])
    np.testing.assert_allclose(value, float(np.sum((2 * np.asarray(_W)) ** 2)))


def test_at_the_top_level_nothing_changes() -> None:
    stats = _stats()
    tc.jit(_loss, policy="alias")(_W, stats)
    np.testing.assert_allclose(stats["act_mean"], _plain_stats(_W)[0])
