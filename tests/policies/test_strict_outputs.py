"""Rule J15: under ``strict`` every output leaf is what ``jax.jit`` returns: an input value the
function hands back untouched (a Python scalar, a NumPy array or scalar) comes back as the
``jax.Array`` jax.jit returns for it, with jax.jit's dtype and weak type; a ``jax.Array``
input returned untouched may stay the caller's object (it is immutable and equal). Under
``alias`` the same value is plain Python's, the caller's own object (rule J7)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

# Every kind of leaf value a caller passes: Python scalars, NumPy arrays and scalars of several
# dtypes (float64 too: jax.jit canonicalizes it), JAX arrays, weakly typed JAX values.
LEAVES = {
    "bool": True,
    "int": 3,
    "negative_int": -7,
    "float": 2.5,
    "complex": 1 + 2j,
    "np_float32": np.arange(3, dtype=np.float32),
    "np_float64": np.linspace(0.0, 1.0, 4),
    "np_int8": np.array([1, -2], dtype=np.int8),
    "np_int64": np.arange(2, dtype=np.int64),
    "np_uint8": np.array([200], dtype=np.uint8),
    "np_bool": np.array([True, False]),
    "np_float16_0d": np.array(1.5, dtype=np.float16),
    "np_scalar_float32": np.float32(0.25),
    "np_scalar_int16": np.int16(5),
    "np_scalar_bool": np.bool_(False),
    "jax_float32": jnp.ones(2),
    "jax_int32": jnp.arange(3),
    "jax_weak_float": jnp.asarray(1.0) * 2,  # weakly typed
    "jax_weak_int": jnp.array(4) + 0,
    "jax_bfloat16": jnp.ones(2, dtype=jnp.bfloat16),
}


def _describe(x):
    return (type(x), np.dtype(x.dtype) if hasattr(x, "dtype") else None, _weak(x))


def _weak(x):
    return getattr(x, "weak_type", None)


def _check_like_jax_jit(out, expected, caller_value):
    assert type(out) is type(expected), (type(out), type(expected))
    assert out.dtype == expected.dtype
    assert out.weak_type == expected.weak_type
    assert out.shape == expected.shape
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    if not isinstance(caller_value, jax.Array):
        assert out is not caller_value


@pytest.mark.parametrize("kind", list(LEAVES))
@pytest.mark.parametrize("how", ["alone", "in_tuple", "input_dict_returned"])
def test_strict_pass_through_leaf_is_what_jax_jit_returns(kind, how):
    value = LEAVES[kind]

    def f(state):
        if how == "alone":
            return state["v"]
        if how == "in_tuple":
            return (state["v"], state["v"] + 0)
        return state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # int64/float64 truncated, as jax.jit
        expected = jax.tree_util.tree_leaves(jax.jit(f)({"v": value}))
        out = jax.tree_util.tree_leaves(tc.jit(f, policy="strict")({"v": value}))
        again = jax.tree_util.tree_leaves(tc.jit(f, policy="strict")({"v": value}))
    assert len(out) == len(expected)
    for o, e in zip(out, expected, strict=True):
        _check_like_jax_jit(o, e, value)
    for o, e in zip(again, expected, strict=True):  # the cached call too
        _check_like_jax_jit(o, e, value)


def test_strict_mixed_state_matches_jax_jit_leaf_by_leaf():
    """The issue's example, over every leaf kind at once (several positional arguments and a
    keyword one): types, dtypes and weak types equal jax.jit's, a jax.Array returned untouched
    is the caller's object or equal to jax.jit's."""
    state = dict(LEAVES)

    def f(s, n, *, scale):
        return s, n, scale, s["float"] * scale

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = jax.jit(f)(state, 3, scale=2.0)
        jitted = tc.jit(f, policy="strict")
        for _ in range(2):
            out = jitted(state, 3, scale=2.0)
            assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(expected)
            got, want = jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(expected)
            assert [_describe(x) for x in got] == [_describe(x) for x in want]
    assert out[0] is not state  # strict's results are fresh containers (rule J16)
    assert out[0]["jax_float32"] is state["jax_float32"]


def test_alias_keeps_plain_pythons_values():
    """Rule J7 is unchanged under alias: the caller's own objects come back."""
    state = {"n": 3, "x": np.ones(2), "f": 0.5}
    out = tc.jit(lambda s: (s["n"], s["x"], s["f"]), policy="alias")(state)
    assert out[0] == 3 and type(out[0]) is int
    assert out[1] is state["x"] and out[2] == 0.5 and type(out[2]) is float


def test_strict_jit_partial_returns_jax_arrays_for_bound_python_values():
    state = {"count": 0, "table": np.arange(3.0), "w": jnp.ones(2)}
    p = tc.jit_partial(lambda s, x: (s["count"], s["table"], s["w"] * x), state, policy="strict")
    expected = jax.jit(lambda s, x: (s["count"], s["table"], s["w"] * x))(state, 2.0)
    for _ in range(2):
        out = p(2.0)
        assert [_describe(x) for x in out] == [_describe(x) for x in expected]
    assert state["count"] == 0 and type(state["count"]) is int  # the caller's untouched


def test_strict_nnx_state_with_python_values_round_trips_like_jax_jit():
    """flax nnx: a module's state holding Python values (a Variable of an int, as nnx's own
    graph tests build) passed through a strict jit and merged back works as under jax.jit;
    before rule J15 the int came back as an int and ``variable[...]`` failed."""
    nnx = pytest.importorskip("flax.nnx")

    class Counter(nnx.Module):
        def __init__(self):
            self.count = nnx.Variable(1)
            self.w = nnx.Param(jnp.ones(2))

    def step(graphdef, state):
        model = nnx.merge(graphdef, state)
        model.w[...] = model.w[...] * 2
        return nnx.split(model)

    results = {}
    for name, jit in {"jax.jit": jax.jit, "strict": lambda f: tc.jit(f, policy="strict")}.items():
        graphdef, state = nnx.split(Counter())
        graphdef, state = jit(step)(graphdef, state)
        model = nnx.merge(graphdef, state)
        results[name] = (model.count[...], model.w[...])
    (count_j, w_j), (count_s, w_s) = results["jax.jit"], results["strict"]
    assert _describe(count_s) == _describe(count_j)
    assert int(count_s) == int(count_j) == 1
    np.testing.assert_array_equal(w_s, w_j)


def _new_ref():
    for owner in (jax, getattr(jax, "ref", None)):
        made = getattr(owner, "new_ref", None)
        if made is not None:
            return made
    return None


@pytest.mark.skipif(_new_ref() is None, reason=f"jax {jax.__version__} has no jax.new_ref")
@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_a_ref_handed_back_is_the_callers_ref(policy):
    """Rule J15: a JAX Ref handed back untouched is the caller's Ref under strict as under
    alias (jax.jit returns no Ref, and a copy would not be the Ref the function wrote)."""
    state = {"r": _new_ref()(jnp.arange(3.0))}

    def f(s):
        s["r"][0] = 7.0
        return s["r"], s["r"][0] * 2

    ref, doubled = tc.jit(f, policy=policy)(state)
    assert ref is state["r"] and float(doubled) == 14.0
    np.testing.assert_array_equal(np.asarray(ref[...]), [7.0, 1.0, 2.0])


def test_strict_returns_a_deeply_nested_input_with_jax_arrays():
    """A result nested deeper than JAX's own flatten can go (it recurses natively): strict's
    look for handed-back inputs must not use it (found by benches/scaling_table.py)."""
    depth = 3000
    tree: list = [1.5]
    for _ in range(depth):
        tree = [tree]
    out = tc.jit(lambda t: t, policy="strict")(tree)
    for _ in range(depth):
        assert type(out) is list and len(out) == 1
        out = out[0]
    (leaf,) = out
    assert isinstance(leaf, jax.Array) and leaf.weak_type and float(leaf) == 1.5
