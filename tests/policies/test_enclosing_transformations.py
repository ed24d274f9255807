"""Rule J31: an alias call inside an enclosing JAX transformation never leaves a tracer of it
in a caller's object. Each case is checked against the plain Python program on NumPy copies
(what the caller's objects must hold) or against the error, with the caller untouched."""

from __future__ import annotations

import contextlib
import re
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
# leaves (jax.vmap's unbatched argument): rule J31's error.
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


# --- Every lifted transformation, inside every enclosing JAX transformation ------------------
# Rule J31 is one check in the write-back every lifted transformation shares (the native
# CallPlan.apply calls _effects.enclosing.EnclosingWrites), so each of them is held to it: an
# object from outside the enclosing transformation is refused, naming the key path, and one
# made inside it, or passed to it as its own argument, is written as plain Python writes it.


def _bump(s: dict, w: Any) -> Any:
    """The function each lifted transformation runs once: ``s["m"] += sum(2 w)`` in place."""
    s["m"] = s["m"] + (w * 2).sum()
    return (w**2).sum()


_MESH = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
_P = jax.sharding.PartitionSpec

# name -> (run(s, w, policy) -> scalar, running _bump(s, w) once; the key path of s["m"]).
_LIFTED: dict[str, tuple[Callable[[dict, Any, str], Any], str]] = {
    "jit": (lambda s, w, p: tc.jit(_bump, policy=p)(s, w), "s['m']"),
    "jit_partial": (lambda s, w, p: tc.jit_partial(_bump, s, policy=p)(w), "s['m']"),
    "call": (lambda s, w, p: tc.call(_bump, s, w, policy=p), "s['m']"),
    "grad": (
        lambda s, w, p: tc.grad(lambda w, s: _bump(s, w), policy=p)(w, s).sum(),
        "s['m']",
    ),
    "value_and_grad": (
        lambda s, w, p: tc.value_and_grad(lambda w, s: _bump(s, w), policy=p)(w, s)[0],
        "s['m']",
    ),
    "checkpoint": (lambda s, w, p: tc.checkpoint(_bump, policy=p)(s, w), "s['m']"),
    "vmap": (
        lambda s, w, p: tc.vmap(lambda s, w, x: _bump(s, w) * x, in_axes=(None, None, 0), policy=p)(
            s, w, jnp.ones(1)
        ).sum(),
        "s['m']",
    ),
    "cond": (
        lambda s, w, p: tc.cond(w.sum() > -1.0, _bump, lambda s, w: (w**2).sum(), s, w, policy=p),
        "s['m']",
    ),
    "switch": (
        lambda s, w, p: tc.switch(
            (w.sum() < -1.0).astype(int), [_bump, lambda s, w: (w**2).sum()], s, w, policy=p
        ),
        "s['m']",
    ),
    "scan": (
        lambda s, w, p: tc.scan(lambda c, x: (c, _bump(c, x)), s, w[None], policy=p)[1].sum(),
        "init['m']",
    ),
    "fori_loop": (
        lambda s, w, p: tc.fori_loop(
            0, 1, lambda i, c: (c[0], c[1], _bump(c[0], c[1])), (s, w, 0.0), policy=p
        )[2],
        "init_val[0]['m']",
    ),
    "while_loop": (
        lambda s, w, p: tc.while_loop(
            lambda c: c[2] < 1,
            lambda c: (c[0], c[1], c[2] + 1 + 0 * _bump(c[0], c[1])),
            (s, w, 0),
            policy=p,
        )[2],
        "init_val[0]['m']",
    ),
    "shard_map": (
        lambda s, w, p: tc.shard_map(
            _bump, mesh=_MESH, in_specs=(_P(), _P()), out_specs=_P(), policy=p
        )(s, w),
        "s['m']",
    ),
}

# name -> run(f, w, s): the enclosing JAX transformation around f(w, s) -> scalar, with s
# passed to it as its own argument (so that the function gets the transformation's copy).
_ENCLOSING: dict[str, Callable[[Callable, Any, dict], Any]] = {
    "jax.jit": lambda f, w, s: jax.jit(f)(w, s),
    "jax.grad": lambda f, w, s: jax.grad(f, argnums=(0, 1))(w, s),
    "jax.vmap": lambda f, w, s: jax.vmap(f)(w[None], jax.tree.map(lambda x: x[None], s)),
    "jax.lax.scan": lambda f, w, s: jax.lax.scan(lambda c, x: (c, f(x, c)), s, w[None]),
    "jax.checkpoint": lambda f, w, s: jax.checkpoint(f)(w, s),
}

_W4 = jnp.arange(4.0)


def _plain(s: dict, w: Any, policy: str) -> Any:
    """The plain Python program every lifted transformation stands for here."""
    _bump(s, w)
    return s["m"]


@pytest.mark.parametrize("enclosing", list(_ENCLOSING))
@pytest.mark.parametrize("lifted", list(_LIFTED))
@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_every_lifted_transformation_inside_every_jax_transformation_keeps_no_tracer(
    policy: str, lifted: str, enclosing: str
) -> None:
    if lifted == "while_loop" and enclosing == "jax.grad":
        pytest.skip("JAX cannot reverse-differentiate a while_loop, plain or lifted")
    run, path = _LIFTED[lifted]
    outside = {"m": jnp.zeros(())}

    def on_outside(w: Any, s: dict) -> Any:
        return run(outside, w, policy)

    if policy == "alias":
        match = rf"(?s)inside a JAX transformation \({re.escape(enclosing)}.*{re.escape(path)}"
        with pytest.raises(ValueError, match=match):
            _ENCLOSING[enclosing](on_outside, _W4, {"m": jnp.zeros(())})
    else:  # strict writes nothing back: its MutationError, or a new result
        with contextlib.suppress(tc.MutationError):
            _ENCLOSING[enclosing](on_outside, _W4, {"m": jnp.zeros(())})
    assert not isinstance(outside["m"], Tracer)  # nothing written, no tracer left
    np.testing.assert_array_equal(outside["m"], 0.0)

    # An object made inside the enclosing transformation (holding its values) and its own
    # argument (its copy) are written as plain Python writes them.
    def made_inside(program: Callable) -> Callable:
        def f(w: Any, s: dict) -> Any:
            inside = {"m": w.sum() * 0.0}
            program(inside, w, policy)
            return inside["m"]

        return f

    def own_argument(program: Callable) -> Callable:
        def f(w: Any, s: dict) -> Any:
            program(s, w, policy)
            return s["m"]

        return f

    if policy == "strict":
        return
    for make in (made_inside, own_argument):
        given = {"m": jnp.ones(())}
        want = _ENCLOSING[enclosing](make(_plain), _W4, {"m": jnp.ones(())})
        got = _ENCLOSING[enclosing](make(run), _W4, given)
        jax.tree.map(np.testing.assert_allclose, got, want)
        np.testing.assert_array_equal(given["m"], 1.0)  # JAX's copy took the write


def test_the_issues_nnx_step_is_refused_as_nnx_refuses_it() -> None:
    # Issue 57's program: a jax.jit step closing over a global nnx model (BatchNorm statistics
    # updated in place) and calling treeclone.value_and_grad under alias. nnx refuses the same
    # program at once (its graph nodes are from another trace level); treeclone refuses it
    # too, naming the statistic, before anything is written.
    nnx = pytest.importorskip("flax.nnx")
    from nnx_models import Block

    def loss(m: Any, x: Any) -> Any:
        return (m(x) ** 2).mean()

    model, x = Block(3, 2, rngs=nnx.Rngs(0)), jnp.ones((4, 3))
    step = jax.jit(lambda x: tc.value_and_grad(loss, policy="alias", wrt=nnx.Param)(model, x)[0])
    with pytest.raises(ValueError, match=r"(?s)inside a JAX transformation \(jax\.jit\).*m\.bn"):
        step(x)
    assert not isinstance(model.bn.mean.value, Tracer)
    np.testing.assert_array_equal(model.bn.mean.value, 0.0)
    with pytest.raises(ValueError, match="trace level"):  # nnx's own refusal
        nnx.jit(lambda x: nnx.value_and_grad(loss)(model, x)[0])(x)
