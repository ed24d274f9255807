"""``treeclone.cond`` and ``treeclone.switch`` under each policy (docs/semantics.md, "cond and
switch"): ``clone`` against ``jax.lax.cond``/``switch``; ``alias`` against the plain Python
``if`` (indexed call) run on NumPy copies of the same objects; ``strict`` against the
MutationError; composition with ``treeclone.jit`` and ``treeclone.grad``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from treeclone._jax_compat import DebugInfo


def hit(s):
    s["hits"] = s["hits"] + 1
    s["log"].append(s["x"] * 2)
    return s["x"] * 2


def miss(s):
    s["misses"] = s["misses"] + 1
    s["log"].append(s["x"] - 1)
    return s["x"] - 1


def _state(lib=jnp):
    return {
        "x": lib.asarray(np.float32(3.0)),
        "hits": lib.zeros(()),
        "misses": lib.zeros(()),
        "log": [],
    }


def _plain_if(pred, true_fun, false_fun, *operands):
    return true_fun(*operands) if pred else false_fun(*operands)


def _assert_state_equal(got, want):
    assert list(got) == list(want)
    for k in want:
        if isinstance(want[k], list):
            assert len(got[k]) == len(want[k])
            for a, b in zip(got[k], want[k], strict=True):
                np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_array_equal(got[k], want[k])
            assert not isinstance(got[k], jax.core.Tracer)


# --- clone ----------------------------------------------------------------------------------------


def test_clone_cond_and_switch_are_jaxs_own_calls():
    for pred in (True, False, jnp.bool_(True), 0, 2.5):
        s, r = _state(), _state()
        ours = tc.cond(pred, hit, miss, s)
        theirs = jax.lax.cond(pred, hit, miss, r)
        np.testing.assert_array_equal(ours, theirs)
        _assert_state_equal(s, r)  # both: the caller's dict untouched (JAX's fresh copies)
        assert s["log"] == [] and float(s["hits"]) == 0
    for index in (-3, 0, 1, 2, 9):
        ours = tc.switch(index, [lambda x: x + 1, lambda x: x * 2, lambda x: -x], jnp.ones(2))
        theirs = jax.lax.switch(
            index, [lambda x: x + 1, lambda x: x * 2, lambda x: -x], jnp.ones(2)
        )
        np.testing.assert_array_equal(ours, theirs)
    branches = [lambda x: x + 1, lambda x: x * 2]
    assert str(jax.make_jaxpr(lambda i, x: tc.switch(i, branches, x))(0, 1.0)) == str(
        jax.make_jaxpr(lambda i, x: jax.lax.switch(i, branches, x))(0, 1.0)
    )
    assert str(jax.make_jaxpr(lambda p, x: tc.cond(p, *branches, x))(True, 1.0)) == str(
        jax.make_jaxpr(lambda p, x: jax.lax.cond(p, *branches, x))(True, 1.0)
    )


def test_clone_is_the_default_and_a_policy_block_overrides_it():
    s = _state()
    tc.cond(True, hit, miss, s)
    assert s["log"] == []
    with tc.policy("alias"):
        tc.cond(True, hit, miss, s)
    assert len(s["log"]) == 1 and float(s["hits"]) == 1


# --- alias: plain Python on the caller's objects ------------------------------------------------


@pytest.mark.parametrize("pred", [True, False, np.bool_(True), jnp.asarray(False), 3, 0.0])
def test_alias_cond_is_the_plain_if_on_the_callers_objects(pred):
    s, ref = _state(), _state(np)
    log, x = s["log"], s["x"]
    got = tc.cond(pred, hit, miss, s, policy="alias")
    want = _plain_if(pred, hit, miss, ref)
    np.testing.assert_array_equal(got, want)
    _assert_state_equal(s, ref)
    assert s["log"] is log and s["x"] is x  # the caller's list, its untouched array


def test_alias_returned_operand_is_the_callers_object_and_untouched_arrays_are_kept():
    w, b = jnp.ones(3), jnp.zeros(3)
    params = {"w": w, "b": b}

    def grow(p):
        p["b"] = p["b"] + 1
        return p

    def keep(p):
        return p

    for pred in (True, False):
        out = tc.cond(pred, grow, keep, params, policy="alias")
        assert out is params and params["w"] is w
    np.testing.assert_array_equal(params["b"], np.ones(3))


def test_alias_traces_both_branches_like_jax_even_with_a_concrete_predicate():
    traced = {"ours": [], "jax": []}

    def branch(name, who):
        def f(s):
            traced[who].append(name)
            s["n"] = s["n"] + 1
            return s["n"]

        return f

    for who, cond in (("ours", lambda *a: tc.cond(*a, policy="alias")), ("jax", jax.lax.cond)):
        cond(True, branch("t", who), branch("f", who), {"n": jnp.zeros(())})
    assert sorted(traced["ours"]) == sorted(traced["jax"]) == ["f", "t"]


def test_alias_under_disable_jit_runs_only_the_taken_branch_as_jax_does():
    ran = []

    def t(s):
        ran.append("t")
        s["n"] = s["n"] + float(s["n"])  # concrete: no tracing under disable_jit
        return s

    def f(s):
        ran.append("f")
        return s

    s = {"n": jnp.ones(())}
    with jax.disable_jit():
        out = tc.cond(True, t, f, s, policy="alias")
        jax.lax.cond(True, lambda s: ran.append("jax-t"), lambda s: ran.append("jax-f"), 1.0)
    assert out is s and float(s["n"]) == 2.0 and ran == ["t", "jax-t"]


def test_alias_branches_may_write_different_leaves():
    def scale(p):
        p["w"] = p["w"] * 2

    def shift(p):
        p["b"] = p["b"] + 1

    for pred in (True, False):
        p, ref = {"w": jnp.ones(2), "b": jnp.zeros(2)}, {"w": np.ones(2), "b": np.zeros(2)}
        tc.cond(pred, scale, shift, p, policy="alias")
        _plain_if(pred, scale, shift, ref)
        _assert_state_equal(p, ref)

    # inside jit, with a traced predicate: the joined plan (every branch outputs both leaves)
    step = tc.jit(lambda pred, p: tc.cond(pred, scale, shift, p, policy="alias"), policy="alias")
    for pred in (True, False, True):
        p, ref = {"w": jnp.ones(2), "b": jnp.zeros(2)}, {"w": np.ones(2), "b": np.zeros(2)}
        step(pred, p)
        _plain_if(pred, scale, shift, ref)
        _assert_state_equal(p, ref)


def test_alias_cond_inside_jit_equals_plain_python_and_compiles_once():
    traces = []

    def step(pred, s):
        traces.append(1)
        return tc.cond(pred, hit, miss, s, policy="alias")

    jitted = tc.jit(step, policy="alias")
    s, ref = _state(), _state(np)
    log = s["log"]
    for pred in (True, False, False, True):
        s["log"] = log  # the list grows by one each call: keep the structure fixed
        del log[:]
        del ref["log"][:]
        got = jitted(jnp.asarray(pred), s)
        want = _plain_if(pred, hit, miss, ref)
        np.testing.assert_allclose(got, want)
        _assert_state_equal(s, ref)
        assert s["log"] is log
    assert len(traces) == 1


def test_alias_cond_under_grad_updates_the_caller_and_differentiates_the_taken_branch():
    def loss(w, stats, pred):
        def on(stats):
            stats["calls"] = stats["calls"] + 1
            return jnp.sum(jnp.sin(w) * 3)

        def off(stats):
            stats["skips"] = stats["skips"] + 1
            return jnp.sum(w**2)

        return tc.cond(pred, on, off, stats, policy="alias")

    w = jnp.array([0.5, -1.0])
    for pred in (True, False):
        stats = {"calls": jnp.zeros(()), "skips": jnp.zeros(())}
        g = tc.grad(loss, policy="alias")(w, stats, pred)
        want = jax.grad(lambda w, p=pred: jnp.sum(jnp.sin(w) * 3) if p else jnp.sum(w**2))(w)
        np.testing.assert_allclose(g, want, rtol=1e-6)
        assert float(stats["calls"]) == float(pred) and float(stats["skips"]) == 1 - float(pred)
        assert not isinstance(stats["calls"], jax.core.Tracer)


def test_alias_grad_through_operands_of_cond_inside_jit():
    def loss(params, stats, pred):
        def a(params, stats):
            stats["n"] = stats["n"] + 1
            return jnp.sum(params["w"] ** 3)

        def b(params, stats):
            return jnp.sum(params["w"] * 2)

        return tc.cond(pred, a, b, params, stats, policy="alias")

    step = tc.jit(tc.grad(loss, policy="alias"), policy="alias")
    for pred in (True, False):
        params, stats = {"w": jnp.array([1.0, 2.0])}, {"n": jnp.zeros(())}
        g = step(params, stats, jnp.asarray(pred))
        want = 3 * params["w"] ** 2 if pred else 2 * jnp.ones(2)
        np.testing.assert_allclose(g["w"], want)
        assert float(stats["n"]) == float(pred)


def test_alias_nested_cond():
    def inner_t(s):
        s["a"] = s["a"] + 1

    def inner_f(s):
        s["b"] = s["b"] + 1

    def outer_t(s, q):
        tc.cond(q, inner_t, inner_f, s, policy="alias")
        s["c"] = s["c"] + 10

    def outer_f(s, q):
        s["c"] = s["c"] - 10

    def plain(p, q, s):
        if p:
            if q:
                s["a"] = s["a"] + 1
            else:
                s["b"] = s["b"] + 1
            s["c"] = s["c"] + 10
        else:
            s["c"] = s["c"] - 10

    f = tc.jit(lambda p, q, s: tc.cond(p, outer_t, outer_f, s, q, policy="alias"), policy="alias")
    for p in (True, False):
        for q in (True, False):
            for run in (
                lambda s, p=p, q=q: tc.cond(p, outer_t, outer_f, s, q, policy="alias"),
                lambda s, p=p, q=q: f(p, q, s),
            ):
                s = {k: jnp.zeros(()) for k in "abc"}
                ref = {k: np.zeros(()) for k in "abc"}
                run(s)
                plain(p, q, ref)
                _assert_state_equal(s, ref)


def test_alias_shared_array_written_at_different_places_by_each_branch():
    """One array at three places: each branch writes a different one. Eagerly the caller sees
    exactly the taken branch's write-back (the places it left stay the caller's array); inside
    jit the joined plan holds the three places apart."""

    def wa(d):
        d["a"] = d["a"] + 1

    def wc(d):
        d["c"] = d["c"] + 2

    step = tc.jit(lambda i, d: tc.switch(i, [wa, wc], d, policy="alias"), policy="alias")
    for index in (0, 1):
        for run in (
            lambda d, i=index: tc.switch(i, [wa, wc], d, policy="alias"),
            lambda d, i=index: step(i, d),
        ):
            w = jnp.ones(2)
            d = {"a": w, "b": w, "c": w}
            ref = {"a": np.ones(2), "b": np.ones(2), "c": np.ones(2)}
            run(d)
            [wa, wc][index](ref)
            _assert_state_equal(d, ref)
        w = jnp.ones(2)
        d = {"a": w, "b": w, "c": w}
        tc.switch(index, [wa, wc], d, policy="alias")
        untouched = ["b", "c"] if index == 0 else ["a", "b"]
        assert all(d[k] is w for k in untouched)


def test_alias_switch_clamps_the_index_as_jax_does():
    def make(k):
        def f(s):
            s["taken"] = s["taken"] * 0 + k
            return k * s["x"]

        return f

    branches = [make(k) for k in range(3)]
    jitted = tc.jit(lambda i, s: tc.switch(i, branches, s, policy="alias"), policy="alias")
    for index in (-5, -1, 0, 1, 2, 3, 100):
        want = jax.lax.switch(index, [lambda x, k=k: k * x for k in range(3)], 2.0)
        for run in (
            lambda s, i=index: tc.switch(i, branches, s, policy="alias"),
            lambda s, i=index: jitted(i, s),
        ):
            s = {"x": jnp.asarray(2.0), "taken": jnp.zeros((), jnp.int32)}
            np.testing.assert_array_equal(run(s), want)
            assert int(s["taken"]) == min(max(index, 0), 2)


def test_alias_switch_with_one_branch_calls_it_directly_as_jax_does():
    def only(s):
        s["n"] = s["n"] + float(s["n"])  # concrete: JAX calls a single branch without tracing
        return s

    s = {"n": jnp.ones(())}
    assert tc.switch(7, [only], s, policy="alias") is s and float(s["n"]) == 2.0
    jax.lax.switch(7, [lambda s: float(s["n"])], s)  # the same call JAX accepts


def test_alias_operand_keyword_and_old_cond_form_as_jax():
    s = {"n": jnp.zeros(())}

    def bump(s):
        s["n"] = s["n"] + 1

    tc.cond(True, bump, bump, operand=s, policy="alias")
    assert float(s["n"]) == 1
    with pytest.raises(TypeError, match="operand"):
        tc.cond(True, bump, bump, s, operand=s, policy="alias")
    # jax.lax.cond(pred, x_true, f_true, x_false, f_false)
    a, b = {"n": jnp.zeros(())}, {"n": jnp.zeros(())}
    tc.cond(False, a, bump, b, bump, policy="alias")
    assert float(a["n"]) == 0 and float(b["n"]) == 1


# --- alias: what cannot be one plan -------------------------------------------------------------


def _raises_and_leaves_untouched(fn, s, match, error=ValueError):
    before = {k: v for k, v in s.items()}
    with pytest.raises(error, match=match) as info:
        fn()
    assert list(s) == list(before) and all(s[k] is before[k] for k in before)
    return str(info.value)


def test_alias_branches_changing_the_structure_differently_name_the_key_path():
    def add(s):
        s["new"] = s["x"] + 1

    def keep(s):
        pass

    s = {"x": jnp.ones(2)}
    for pred in (True, False):
        message = _raises_and_leaves_untouched(
            lambda p=pred: tc.cond(p, add, keep, s, policy="alias"), s, r"s\['new'\]"
        )
        assert "true_fun" in message and "false_fun" in message
    with pytest.raises(ValueError, match=r"s\['inner'\]\[1\]|s\['inner'\]"):
        tc.switch(
            0, [lambda s: s["inner"].append(1.0), lambda s: None], {"inner": [2.0]}, policy="alias"
        )


def test_alias_branch_changing_a_dtype_or_shape_differently_names_the_leaf():
    def cast(s):
        s["x"] = s["x"].astype(jnp.int32)

    s = {"x": jnp.ones(2)}
    message = _raises_and_leaves_untouched(
        lambda: tc.cond(True, cast, lambda s: None, s, policy="alias"), s, r"s\['x'\]"
    )
    assert "int32" in message and "float32" in message


def test_alias_result_identity_must_agree_across_branches():
    s = {"x": jnp.ones(2)}
    _raises_and_leaves_untouched(
        lambda: tc.cond(True, lambda s: s, lambda s: {"x": s["x"] * 2}, s, policy="alias"),
        s,
        "result",
    )


def test_alias_results_of_different_structure_are_jaxs_error():
    def run(cond):
        return cond(True, lambda x: x, lambda x: (x, x), jnp.ones(2))

    with pytest.raises(TypeError) as ours:
        run(lambda *a: tc.cond(*a, policy="alias"))
    with pytest.raises(TypeError) as theirs:
        run(jax.lax.cond)
    assert str(ours.value).split("\n")[0] == str(theirs.value).split("\n")[0]
    assert "true_fun output is a pytree leaf" in str(ours.value)


def test_alias_bad_predicate_or_index_is_jaxs_error():
    for bad in (jnp.ones(2), "yes", None):
        with pytest.raises(TypeError) as ours:
            tc.cond(bad, lambda: 0, lambda: 0, policy="alias")
        with pytest.raises(TypeError) as theirs:
            jax.lax.cond(bad, lambda: 0, lambda: 0)
        assert str(ours.value) == str(theirs.value)
    for bad in (1.5, jnp.ones(2)):
        with pytest.raises(TypeError) as ours:
            tc.switch(bad, [lambda: 0, lambda: 1], policy="alias")
        with pytest.raises(TypeError) as theirs:
            jax.lax.switch(bad, [lambda: 0, lambda: 1])
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="Empty branch sequence"):
        tc.switch(0, [], policy="alias")


def test_alias_cycle_is_the_value_error_of_every_policy():
    s: dict = {"x": jnp.ones(())}
    s["self"] = s
    for policy in ("clone", "alias", "strict"):
        with pytest.raises(ValueError, match="cycle|cyclic|itself"):
            tc.cond(True, lambda s: None, lambda s: None, s, policy=policy)


# --- strict --------------------------------------------------------------------------------------


def test_strict_names_an_unreturned_mutation_in_any_branch_even_not_taken():
    s = _state()
    for pred in (True, False):
        with pytest.raises(tc.MutationError, match=r"s\['hits'\]|s\['misses'\]"):
            tc.cond(pred, hit, miss, s, policy="strict")
    assert s["log"] == [] and float(s["hits"]) == 0

    def quiet(s):
        return s["x"]

    with pytest.raises(tc.MutationError, match=r"(?s)miss mutated .*s\['log'\]"):
        tc.cond(True, quiet, miss, s, policy="strict")  # miss is not taken, but traced


def test_strict_accepts_returned_mutations_and_pure_branches():
    def bump(s):
        s["hits"] = s["hits"] + 1
        return s

    s = {"hits": jnp.zeros(())}
    out = tc.cond(True, bump, lambda s: s, s, policy="strict")
    assert float(out["hits"]) == 1 and float(s["hits"]) == 0  # strict: a fresh result
    out = tc.switch(1, [lambda x: x + 1, lambda x: x * 3], jnp.ones(2), policy="strict")
    np.testing.assert_array_equal(out, 3 * np.ones(2))


@dataclasses.dataclass
class Pair:
    a: object
    b: object


jax.tree_util.register_dataclass(Pair, data_fields=["a", "b"], meta_fields=[])


class Box:
    """A custom node (not a dataclass) whose unflatten converts its children: write-back
    rebuilds it and sets the attributes that changed."""

    def __init__(self, a, b):
        self.a, self.b = a, b


jax.tree_util.register_pytree_node(
    Box, lambda n: ((n.a, n.b), None), lambda _, c: Box(jnp.asarray(c[0]), jnp.asarray(c[1]))
)


@pytest.mark.parametrize("kind", [Pair, Box])
def test_alias_branches_setting_different_attributes_of_one_object(kind):
    def set_a(p):
        p.a = p.a + 1

    def set_b(p):
        p.b = p.b * 3

    step = tc.jit(lambda pred, p: tc.cond(pred, set_a, set_b, p, policy="alias"), policy="alias")
    for pred in (True, False):
        for run in (
            lambda p, q=pred: tc.cond(q, set_a, set_b, p, policy="alias"),
            lambda p, q=pred: step(jnp.asarray(q), p),
        ):
            p = kind(jnp.ones(2), jnp.ones(2))
            run(p)
            want_a, want_b = (2.0, 1.0) if pred else (1.0, 3.0)
            np.testing.assert_array_equal(p.a, np.full(2, want_a))
            np.testing.assert_array_equal(p.b, np.full(2, want_b))


def test_alias_cond_under_vmap_with_a_batched_predicate_is_the_if_per_example():
    def t(s):
        s["n"] = s["n"] + s["x"]
        return s["x"] * 2

    def f(s):
        s["m"] = s["m"] - 1
        return -s["x"]

    def per_example(p, x, run):
        s = {"x": x, "n": jnp.zeros(()), "m": jnp.zeros(())}
        return run(p, s), s

    preds, xs = jnp.array([True, False, True]), jnp.arange(3.0)
    got, state = jax.vmap(
        lambda p, x: per_example(p, x, lambda p, s: tc.cond(p, t, f, s, policy="alias"))
    )(preds, xs)
    for i, (p, x) in enumerate(zip(preds, xs, strict=True)):
        want, want_state = per_example(bool(p), x, lambda p, s: t(s) if p else f(s))
        np.testing.assert_array_equal(got[i], want)
        for k in want_state:
            np.testing.assert_array_equal(state[k][i], want_state[k])


def test_alias_traces_once_per_call_structure_as_jax_does():
    """JAX keeps the traces of the same branch functions; so does treeclone (per branches,
    policy, operands' structure and abstract values), and each call writes its own caller's
    objects with the plan of that trace."""
    traced = []

    def up(s):
        traced.append("up")
        s["n"] = s["n"] + 1

    def down(s):
        traced.append("down")
        s["n"] = s["n"] - 1

    states = [{"n": jnp.zeros(())} for _ in range(4)]
    for i, s in enumerate(states):
        tc.cond(i % 2 == 0, up, down, s, policy="alias")
    assert sorted(traced) == ["down", "up"]
    assert [float(s["n"]) for s in states] == [1.0, -1.0, 1.0, -1.0]
    tc.cond(True, up, down, {"n": jnp.zeros(3)}, policy="alias")  # another shape: traced again
    assert len(traced) == 4


@pytest.mark.parametrize("pred", [True, False])
def test_strict_pass_through_operands_are_what_lax_cond_returns(pred):
    """Rule C13: strict's outputs are jax.lax.cond's (types, dtypes, weak types); alias's are
    the plain if's, the caller's own objects."""
    state = {"n": 3, "x": np.arange(3.0), "f": 1.5, "b": True, "w": jnp.ones(2)}

    def branch(s, y):
        return s["n"], s["x"], s["f"], s["b"], s["w"], y

    def describe(out):
        return [(type(o), o.dtype, o.weak_type) for o in jax.tree_util.tree_leaves(out)]

    expected = jax.lax.cond(pred, branch, branch, state, 2.0)
    for _ in range(2):  # the cached lifted branches too
        out = tc.cond(pred, branch, branch, state, 2.0, policy="strict")
        assert describe(out) == describe(expected)
        for o, e in zip(out, expected, strict=True):
            np.testing.assert_array_equal(o, e)
    plain = tc.cond(pred, branch, branch, state, 2.0, policy="alias")
    assert plain[0] == 3 and type(plain[0]) is int
    assert plain[1] is state["x"] and plain[4] is state["w"]


# --- JAX Refs among the operands ------------------------------------------------------------------


def _ref_constructor():
    """The installed JAX's Ref maker (jax.new_ref, jax.ref.new_ref, or jax 0.6's
    jax.experimental.mutable_array); None where it has none."""
    for owner in (jax, getattr(jax, "ref", None)):
        made = getattr(owner, "new_ref", None)
        if made is not None:
            return made
    try:
        from jax.experimental import mutable_array
    except ImportError:
        return None
    return mutable_array


NEW_REF = _ref_constructor()
needs_refs = pytest.mark.skipif(
    NEW_REF is None, reason=f"jax {jax.__version__} has no Refs (jax.new_ref)"
)


def _ref_state():
    return {"r": NEW_REF(jnp.arange(3.0)), "x": jnp.asarray(np.float32(2.0))}


def _ref_read_true(s):
    return s["r"][...] * s["x"]


def _ref_read_false(s):
    return s["r"][...] + s["x"]


def _ref_write_true(s):
    s["r"][...] = s["r"][...] + s["x"]  # through the Ref: no change to the operands' tree
    return s["r"][0]


def _ref_write_false(s):
    s["r"][1] = s["x"] * 10
    return s["r"][2]


REF_PROGRAMS = {
    "read": (_ref_read_true, _ref_read_false),
    "write": (_ref_write_true, _ref_write_false),
}


def _jax_reference(api, where, branches, s, pred):
    """The same program with jax.lax.cond/switch (inside jax.jit for 'jit')."""
    t, f = branches
    if api == "cond":
        run = lambda s, p: jax.lax.cond(p, t, f, s)  # noqa: E731
    else:
        run = lambda s, p: jax.lax.switch(p, [f, t], s)  # noqa: E731
    p = pred if api == "cond" else int(pred)
    return (jax.jit(run) if where == "jit" else run)(s, p)


def _ours(api, where, branches, s, pred, policy):
    t, f = branches
    if api == "cond":
        run = lambda s, p: tc.cond(p, t, f, s, policy=policy)  # noqa: E731
    else:
        run = lambda s, p: tc.switch(p, [f, t], s, policy=policy)  # noqa: E731
    p = pred if api == "cond" else int(pred)
    return (tc.jit(run, policy=policy) if where == "jit" else run)(s, p)


@needs_refs
@pytest.mark.parametrize("program", ["read", "write"])
@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
@pytest.mark.parametrize("api", ["cond", "switch"])
@pytest.mark.parametrize("where", ["eager", "jit"])
@pytest.mark.parametrize("pred", [True, False])
def test_a_ref_operand_is_passed_as_jax_passes_it(program, policy, api, where, pred):
    # docs/semantics.md, rule C14: a Ref read or written in a branch is JAX's, under every
    # policy, eagerly and inside jit (a traced predicate there).
    branches = REF_PROGRAMS[program]
    want_s = _ref_state()
    try:
        want = _jax_reference(api, where, branches, want_s, pred)
    except Exception as e:  # noqa: BLE001 - an older JAX without Refs in cond: nothing to match
        pytest.skip(f"jax {jax.__version__}'s {api} does not take this Ref program: {e}")
    s = _ref_state()
    ref, x = s["r"], s["x"]
    got = _ours(api, where, branches, s, pred, policy)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert list(s) == ["r", "x"] and s["r"] is ref and s["x"] is x  # the caller's own objects
    np.testing.assert_array_equal(np.asarray(ref[...]), np.asarray(want_s["r"][...]))


@needs_refs
@pytest.mark.parametrize("where", ["eager", "jit"])
@pytest.mark.parametrize("pred", [True, False])
def test_alias_branches_writing_a_ref_and_the_operands_are_the_plain_if(where, pred):
    # docs/semantics.md, rule C14: under alias the Ref is written as JAX writes it and the
    # other changes reach the caller, as the plain if on the same objects does.
    def t(s):
        s["r"][...] = s["r"][...] * s["x"]
        s["n"] = s["n"] + 1
        return s["r"]  # the caller's Ref itself, as the plain if returns it

    def f(s):
        s["x"] = s["x"] - 1
        return s["r"]

    def fresh():
        return {"n": jnp.zeros(()), **_ref_state()}

    want_s = fresh()
    want_ref = _plain_if(pred, t, f, want_s)
    assert want_ref is want_s["r"]
    s = fresh()
    ref = s["r"]
    run = lambda s, p: tc.cond(p, t, f, s, policy="alias")  # noqa: E731
    got = (tc.jit(run, policy="alias") if where == "jit" else run)(s, pred)
    assert got is ref and s["r"] is ref
    assert list(s) == list(want_s)
    for k in ("n", "x"):
        np.testing.assert_array_equal(np.asarray(s[k]), np.asarray(want_s[k]))
        assert not isinstance(s[k], jax.core.Tracer)
    np.testing.assert_array_equal(np.asarray(ref[...]), np.asarray(want_s["r"][...]))


@needs_refs
def test_a_ref_a_branch_moves_or_makes_is_an_error_naming_the_key_path():
    # docs/semantics.md, rule C14: JAX returns no Ref from a branch, so each place keeps the
    # operand's own Ref in every branch; the caller is untouched.
    def swap(s):
        s["r"], s["q"] = s["q"], s["r"]
        return s["x"]

    def made(s):
        s["r"] = NEW_REF(jnp.zeros(3))
        return s["x"]

    def keep(s):
        return s["x"]

    for branch, message in [
        (swap, r"s\['q'\]: true_fun leaves the Ref from s\['r'\], false_fun leaves the Ref "),
        (made, r"true_fun leaves a JAX Ref at s\['r'\] that is not an operand's own Ref"),
    ]:
        s = {"q": NEW_REF(jnp.ones(3)), **_ref_state()}
        before = dict(s)
        with pytest.raises(ValueError, match=message):
            tc.cond(True, branch, keep, s, policy="alias")
        assert list(s) == list(before) and all(s[k] is before[k] for k in s)


@pytest.mark.skipif(
    DebugInfo is None,
    reason="jax < 0.7 names a traced function's arguments itself",
)
@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
def test_jax_messages_name_each_branch_and_its_own_parameters(policy):
    def quiet(s, y):
        return y

    def loud(state, y):
        if state["x"] > 0:  # a traced value as a bool
            pass
        return y

    state = {"x": jnp.ones(())}
    where = r"the function loud at .* for {api}\. .* the argument state\['x'\]"
    with pytest.raises(jax.errors.TracerBoolConversionError, match=where.format(api="cond")):
        jax.jit(lambda p: tc.cond(p, loud, quiet, state, 1.0, policy=policy))(True)
    with pytest.raises(jax.errors.TracerBoolConversionError, match=where.format(api="switch")):
        jax.jit(lambda i: tc.switch(i, [quiet, loud], state, 1.0, policy=policy))(1)
