"""How static leaves (``traced=``) and static arguments are compared: by identity first, then
with ``==`` where a NaN equals a NaN (``float("nan")``, NumPy's NaN scalars), in every place
that compares them (``_effects.same_static`` / ``same_data``): the branches of ``cond`` and
``switch``, a loop's carry, the cache keys of ``jit``, the loops and ``checkpoint``'s static
arguments, and the ahead-of-time stages. And where the equinox equivalent accepts a static leaf
that cannot be hashed (``eqx.partition`` around ``jax.lax.scan`` / ``cond``, ``eqx.filter_vmap``,
``jax.shard_map``), treeclone accepts it too: such a call is keyed on nothing, traced each
time, never answered from a stale trace.

docs/semantics.md, "Leaves that are not arrays: ``traced=``"."""

from __future__ import annotations

import copy
import math
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

POLICIES = ["clone", "alias", "strict"]


def _same(a: Any, b: Any) -> None:
    """Two trees of arrays and static values: equal leaf by leaf, a NaN equal to a NaN."""
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, (jax.Array, np.ndarray)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
        elif isinstance(x, float) and math.isnan(x):
            assert isinstance(y, float) and math.isnan(y)
        else:
            assert type(x) is type(y) and x == y


def _quiet(run: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        return run()


# --- NaN static leaves ----------------------------------------------------------------------


def _scale(s: dict) -> jax.Array:
    s["w"] = s["w"] * 2.0
    return s["w"].sum()


def _shift(s: dict) -> jax.Array:
    s["w"] = s["w"] + 1.0
    return s["w"].sum()


def _reset_eps(branch: Any) -> Any:
    def run(s: dict) -> jax.Array:
        s["eps"] = float("nan")  # recomputed: another NaN object
        return branch(s)

    return run


def _returning(branch: Any) -> Any:
    return lambda s: (s, branch(s))


@pytest.mark.parametrize("recomputed", [False, True])
@pytest.mark.parametrize("api", ["cond", "switch"])
@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_branches_leaving_a_nan_static_leaf_agree(policy, api, recomputed):
    """A NaN static leaf that no branch touches, or that each recomputes, is one value in every
    branch: the call is the plain ``if`` (not "leave different structures behind"); under
    ``strict`` the branches return the state, and the caller's is left as it was."""
    first, second = (_reset_eps(_scale), _reset_eps(_shift)) if recomputed else (_scale, _shift)
    if policy == "strict":
        first, second = _returning(first), _returning(second)
    branches = [first, second]
    for pred in (True, jnp.asarray(False)):
        state = {"w": jnp.ones(2), "eps": float("nan"), "name": "net"}
        before, reference = copy.copy(state), copy.copy(state)
        want = (first if pred else second)(reference)

        def run(p: Any, s: dict) -> Any:
            if api == "cond":
                return tc.cond(p, first, second, s, policy=policy, traced="arrays")
            return tc.switch(1 - p, branches, s, policy=policy, traced="arrays")

        got = tc.jit(run, policy=policy, traced="arrays")(pred, state)
        if policy == "strict":
            _same(got, want)
            _same(state, before)
            assert all(state[k] is before[k] for k in before)
        else:
            np.testing.assert_allclose(got, want)
            _same(state, reference)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_loop_body_recomputing_a_nan_static_leaf_keeps_it(policy):
    """A static leaf of the carry recomputed as another NaN is the same constant (not "changed
    from nan to nan"): the loop runs, as ``eqx.partition`` around ``jax.lax.scan``, and the
    carry keeps the caller's NaN (rule: an equal new object is the caller's)."""

    def body(c: dict, x: jax.Array) -> tuple[dict, jax.Array]:
        new = {"w": c["w"] + x, "eps": float("nan"), "np_eps": np.float64("nan")}
        return new, new["w"]

    init = {"w": jnp.zeros(()), "eps": float("nan"), "np_eps": np.float64("nan")}
    # NumPy's NaN scalar is static too under this rule (eqx.is_array would trace it).
    rule = lambda x: isinstance(x, jax.Array)  # noqa: E731
    dynamic, static = eqx.partition(init, rule)

    def inner(carry: Any, x: Any) -> tuple[Any, Any]:
        new, y = body(eqx.combine(carry, static), x)
        return eqx.partition(new, rule)[0], y

    want, want_ys = jax.lax.scan(inner, dynamic, jnp.arange(3.0))
    got, ys = _quiet(lambda: tc.scan(body, init, jnp.arange(3.0), policy=policy, traced=rule))
    np.testing.assert_allclose(ys, want_ys)
    np.testing.assert_allclose(got["w"], want["w"])
    assert got["eps"] is init["eps"] and got["np_eps"] is init["np_eps"]
    out = _quiet(
        lambda: tc.fori_loop(0, 3, lambda i, c: body(c, i)[0], init, policy=policy, traced=rule)
    )
    assert float(out["w"]) == 3.0 and out["eps"] is init["eps"]
    out = _quiet(
        lambda: tc.while_loop(
            lambda c: c["w"] < 3, lambda c: body(c, 1.0)[0], init, policy=policy, traced=rule
        )
    )
    assert float(out["w"]) == 3.0 and out["eps"] is init["eps"]


def test_a_nan_static_leaf_or_argument_is_one_cache_key():
    """A NaN static leaf (or static argument) keys one trace: the same NaN object again, or
    another NaN, is not a new trace; and an ahead-of-time stage compiled for one NaN runs
    for another (not "static leaf changed from nan to nan")."""
    traces = []

    def f(s: dict) -> jax.Array:
        traces.append(1)
        return s["w"] * 2

    jitted = tc.jit(f, policy="alias", traced="arrays")
    nan = float("nan")
    for eps in (nan, nan, float("nan"), np.nan):
        jitted({"w": jnp.ones(2), "eps": eps})
    assert len(traces) == 1
    jitted({"w": jnp.ones(2), "eps": 1.0})
    assert len(traces) == 2  # another value: another trace

    compiled = tc.jit(f, policy="alias", traced="arrays").lower({"w": jnp.ones(2), "eps": nan})
    np.testing.assert_allclose(
        compiled.compile()({"w": jnp.ones(2), "eps": float("nan")}), [2.0, 2.0]
    )

    calls = []

    def g(x: jax.Array, eps: float) -> jax.Array:
        calls.append(1)
        return x * 2

    checkpointed = tc.checkpoint(g, static_argnums=(1,), policy="alias")
    for eps in (nan, nan, float("nan")):
        checkpointed(jnp.ones(2), eps)
    assert len(calls) == 1


# --- unhashable static leaves ---------------------------------------------------------------


class Tag:
    """A static value that cannot be hashed (equal by its contents)."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, scale: float):
        self.scale = scale

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tag) and other.scale == self.scale


def _carry(scale: float = 2.0) -> dict:
    return {"w": jnp.ones(2), "tag": Tag(scale), "names": {"a", "b"}}


def _step(c: dict, x: jax.Array) -> tuple[dict, jax.Array]:
    c["w"] = c["w"] * c["tag"].scale + x * len(c["names"])
    return c, c["w"].sum()


def _eqx_scan(init: dict, xs: jax.Array) -> tuple[dict, jax.Array]:
    """``eqx.partition`` around ``jax.lax.scan``: the static half (the Tag, the set) closed
    over, never hashed."""
    dynamic, static = eqx.partition(init, eqx.is_array)

    def inner(carry: Any, x: Any) -> tuple[Any, Any]:
        new, y = _step(eqx.combine(carry, static), x)
        return eqx.partition(new, eqx.is_array)[0], y

    final, ys = jax.lax.scan(inner, dynamic, xs)
    return eqx.combine(final, static), ys


@pytest.mark.parametrize("policy", POLICIES)
def test_loops_accept_an_unhashable_static_leaf_in_the_carry_as_eqx_partition(policy):
    xs = jnp.arange(3.0)
    want, want_ys = _eqx_scan(_carry(), xs)
    init = _carry()
    tag, names = init["tag"], init["names"]
    got, ys = _quiet(lambda: tc.scan(_step, init, xs, policy=policy, traced="arrays"))
    np.testing.assert_allclose(ys, want_ys)
    np.testing.assert_allclose(got["w"], want["w"])
    assert got["tag"] is tag and got["names"] is names  # the caller's own objects
    if policy == "alias":
        assert got is init
    for loop in (
        lambda c: tc.fori_loop(
            0, 3, lambda i, c: _step(c, xs[i])[0], c, policy=policy, traced="arrays"
        ),
        lambda c: tc.while_loop(
            lambda c: c["w"][0] < want["w"][0],
            lambda c: _step(c, 1.0)[0],
            c,
            policy=policy,
            traced="arrays",
        ),
    ):
        out = _quiet(lambda loop=loop: loop(_carry()))
        assert out["tag"] == Tag(2.0) and isinstance(out["names"], set)
    fori = _quiet(
        lambda: tc.fori_loop(
            0, 3, lambda i, c: _step(c, xs[i])[0], _carry(), policy=policy, traced="arrays"
        )
    )
    np.testing.assert_allclose(fori["w"], want["w"])


def test_an_unhashable_static_leaf_is_never_answered_from_a_stale_trace():
    """Keyed on nothing: a Tag changed in place between calls is read again, as by the
    partitioned ``jax.lax.scan`` (which closes over it afresh)."""
    init = _carry()
    xs = jnp.arange(3.0)
    first, _ = tc.scan(_step, copy.copy(init), xs, policy="alias", traced="arrays")
    init["tag"].scale = 3.0
    init["names"].add("c")
    second, _ = tc.scan(_step, copy.copy(init), xs, policy="alias", traced="arrays")
    want, _ = _eqx_scan(init, xs)
    np.testing.assert_allclose(second["w"], want["w"])
    assert not np.allclose(first["w"], second["w"])


@pytest.mark.parametrize("policy", POLICIES)
def test_cond_vmap_and_shard_map_accept_an_unhashable_static_leaf_as_equinox(policy):
    def branch(scale: float) -> Any:
        def run(c: dict) -> jax.Array:
            return (c["w"] * scale * c["tag"].scale).sum() + len(c["names"])

        return run

    state = _carry()
    dynamic, static = eqx.partition(state, eqx.is_array)
    for pred in (True, jnp.asarray(False)):
        want = jax.lax.cond(
            pred,
            lambda d: branch(1.0)(eqx.combine(d, static)),
            lambda d: branch(-1.0)(eqx.combine(d, static)),
            dynamic,
        )
        got = tc.cond(pred, branch(1.0), branch(-1.0), state, policy=policy, traced="arrays")
        np.testing.assert_allclose(got, want)
        got = tc.switch(
            1 - pred, [branch(1.0), branch(-1.0)], state, policy=policy, traced="arrays"
        )
        np.testing.assert_allclose(got, want)

    batch = {"w": jnp.arange(6.0).reshape(3, 2), "tag": Tag(2.0), "names": {"a"}}
    want = eqx.filter_vmap(branch(1.0))(batch)
    np.testing.assert_allclose(tc.vmap(branch(1.0), policy=policy, traced="arrays")(batch), want)

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    mapped = tc.shard_map(
        branch(1.0), mesh=mesh, in_specs=(P(),), out_specs=P(), policy=policy, traced="arrays"
    )
    np.testing.assert_allclose(mapped(state), branch(1.0)(state))


def test_jit_and_checkpoint_still_need_hashable_static_leaves():
    """The compiled code's cache key holds them (``eqx.filter_jit`` refuses them too): the
    TypeError naming the key path."""
    state = _carry()
    for lifted in (
        tc.jit(lambda c: c["w"], policy="alias", traced="arrays"),
        tc.checkpoint(lambda c: c["w"], policy="alias", traced="arrays"),
    ):
        with pytest.raises(TypeError, match=r"c\['names'\]: a static leaf under traced="):
            lifted(state)
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        eqx.filter_jit(lambda c: c["w"])(state)
