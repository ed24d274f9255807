"""``treeclone.vmap`` under each policy (docs/semantics.md, "vmap"): ``clone`` against
``jax.vmap`` itself; ``alias`` against the Python loop over the batch it stands for, run
un-transformed on NumPy copies of the caller's objects (each example on its slice of the mapped
inputs and on the unmapped ones; the mapped state stacked back along its axis); ``strict``
against the MutationError; nesting with ``treeclone.jit``, ``grad`` and itself."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

B = 4


def step(state, cfg, x):
    """Per-example state updated in place; ``cfg`` (unmapped) read only."""
    state["total"] = state["total"] + x * cfg["scale"]
    state["count"] = state["count"] + 1
    state["history"].append(x.sum())
    state["new"] = x[:1] * 2.0  # a key added, the same for every example
    return jnp.tanh(x).sum()


def _state():
    return {
        "total": jnp.arange(B * 3.0).reshape(B, 3),
        "count": jnp.zeros(B, jnp.int32),
        "history": [jnp.ones(B)],
    }


def _cfg():
    return {"scale": jnp.array(0.5)}


XS = jnp.linspace(-1.0, 1.0, B * 3).reshape(B, 3)


def numpy_copy(tree):
    return jax.tree.map(np.array, tree)


def take(tree, i, axis=0):
    return jax.tree.map(lambda a: np.take(np.asarray(a), i, axis=axis), tree)


def stack(trees, axis=0):
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs], axis=axis), *trees)


def python_loop(fun, mapped, unmapped, xs, axis=0):
    """The alias reference: ``fun`` run on each example's slice of ``mapped`` (stacked back
    along ``axis`` afterwards) and on ``unmapped`` itself, without any transform."""
    states, results = [], []
    for i in range(xs.shape[0]):
        state = take(mapped, i, axis)
        results.append(fun(state, unmapped, np.asarray(xs[i])))
        states.append(state)
    return stack(states, axis), stack(results)


def assert_same_values(got, want):
    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(want)
    assert got_def == want_def, (got_def, want_def)
    for a, b in zip(got_leaves, want_leaves, strict=True):
        assert not isinstance(a, jax.core.Tracer)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


# --- clone ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"in_axes": (0, None, 0)},
        {"in_axes": ({"total": 1, "count": 0, "history": None}, None, 0), "out_axes": 0},
        {"in_axes": (0, None, 0), "out_axes": None, "axis_size": B},
    ],
    ids=["default", "tuple", "prefix", "out_none"],
)
def test_clone_vmap_is_jax_vmap(options):
    def f(state, cfg, x):
        value = jnp.sum(state["total"]) * cfg["scale"] + jnp.sum(x)
        return jnp.zeros(()) if options.get("out_axes", 0) is None else value

    state = _state()
    if options.get("in_axes", (0,))[0] != 0 and isinstance(options["in_axes"][0], dict):
        state["total"] = state["total"].T
        state["history"] = [jnp.ones(2)]
    cfg = _cfg() if options else {"scale": jnp.full(B, 0.5)}
    want = jax.vmap(f, **options)(state, cfg, XS)
    got = tc.vmap(f, **options)(state, cfg, XS)
    assert_same_values(got, want)
    # jax.vmap rebuilds the arguments: a mutation never reaches the caller under clone
    state = _state()
    before = numpy_copy(state)
    tc.vmap(step, in_axes=(0, None, 0))(state, _cfg(), XS)
    assert_same_values(state, before)


def test_clone_bad_axes_are_jax_vmaps_errors():
    for bad in [{"in_axes": "a"}, {"out_axes": 1.5}]:
        with pytest.raises(TypeError) as ours:
            tc.vmap(step, **bad)
        with pytest.raises(TypeError) as theirs:
            jax.vmap(step, **bad)
        assert str(ours.value) == str(theirs.value)
    for policy in ["clone", "alias"]:
        with pytest.raises(ValueError, match="len\\(in_axes\\)=2, len\\(args\\)=3"):
            tc.vmap(step, in_axes=(0, None), policy=policy)(_state(), _cfg(), XS)


# --- alias ----------------------------------------------------------------------------------


def test_alias_equals_the_python_loop_over_the_batch():
    state, cfg = _state(), _cfg()
    history, total = state["history"], state["total"]
    want_state, want_result = python_loop(step, numpy_copy(state), numpy_copy(cfg), XS)
    result = tc.vmap(step, in_axes=(0, None, 0), policy="alias")(state, cfg, XS)
    assert_same_values(result, want_result)
    assert_same_values(state, want_state)  # keys added, leaves replaced, the list grown
    assert state["history"] is history  # the caller's containers, written in place
    assert state["total"] is not total and state["total"].shape == (B, 3)
    assert list(state) == ["total", "count", "history", "new"]  # rule J9: new keys after
    assert_same_values(cfg, _cfg())


def test_alias_state_mapped_along_another_axis_keeps_that_axis():
    def f(state, x):
        state["h"] = state["h"] * 2 + x  # per example: (3,)
        state["extra"] = x + 1.0
        return x.sum()

    state = {"h": jnp.arange(3.0 * B).reshape(3, B)}  # the batch on axis 1
    want_state, want_result = python_loop(
        lambda s, _, x: f(s, x), numpy_copy(state), None, XS, axis=1
    )
    got = tc.vmap(f, in_axes=(1, 0), policy="alias")(state, XS)
    assert_same_values(got, want_result)
    assert state["h"].shape == (3, B) and state["extra"].shape == (3, B)
    assert_same_values(state, want_state)
    # a negative axis is the same axis
    again = {"h": jnp.arange(3.0 * B).reshape(3, B)}
    tc.vmap(f, in_axes=(-1, 0), policy="alias")(again, XS)
    assert_same_values(again, want_state)


def test_batched_write_into_an_unmapped_input_is_an_error_naming_the_key_path():
    state, cfg = _state(), {"inner": {"scale": jnp.array(0.5)}}

    def f(state, cfg, x):
        state["count"] = state["count"] + 1  # fine: mapped
        cfg["inner"]["scale"] = cfg["inner"]["scale"] + x.sum()  # batched into unmapped
        return x

    before_state, before_cfg = numpy_copy(state), numpy_copy(cfg)
    with pytest.raises(ValueError, match=r"^cfg\['inner'\]\['scale'\]: .*f wrote a batched value"):
        tc.vmap(f, in_axes=(0, None, 0), policy="alias")(state, cfg, XS)
    assert_same_values(state, before_state)  # nothing written back, not even the mapped one
    assert_same_values(cfg, before_cfg)


def test_unbatched_write_into_an_unmapped_input_is_written_once():
    # Every example computes the same value from the same (unmapped) input: it is written
    # once, as each iteration of the loop would write it starting from the caller's value.
    cfg = {"calls": jnp.zeros(()), "seen": []}

    def f(cfg, x):
        cfg["calls"] = cfg["calls"] + 1
        cfg["seen"].append(jnp.ones(2))
        return x * 2

    got = tc.vmap(f, in_axes=(None, 0), policy="alias")(cfg, XS)
    assert_same_values(got, XS * 2)
    assert_same_values(cfg, {"calls": np.ones(()), "seen": [np.ones(2)]})


def test_values_moved_between_places_take_the_axis_of_their_new_place():
    def f(a, b, cfg):
        a["w"], b["w"] = b["w"], a["w"]  # mapped along 0 and 1: each takes its new place's axis
        a["init"] = jnp.copy(cfg["init"])  # unmapped value written into a mapped input
        return a["w"]

    a = {"w": jnp.arange(B * 2.0).reshape(B, 2)}
    b = {"w": -jnp.arange(B * 2.0).reshape(2, B)}
    cfg = {"init": jnp.array([7.0, 8.0])}
    a_w, b_w = np.asarray(a["w"]), np.asarray(b["w"])
    result = tc.vmap(f, in_axes=(0, 1, None), policy="alias")(a, b, cfg)
    np.testing.assert_array_equal(a["w"], b_w.T)
    np.testing.assert_array_equal(b["w"], a_w.T)
    np.testing.assert_array_equal(a["init"], np.tile([7.0, 8.0], (B, 1)))
    np.testing.assert_array_equal(result, b_w.T)
    np.testing.assert_array_equal(cfg["init"], [7.0, 8.0])  # stays one value


def test_one_value_left_at_places_of_two_axes_is_an_error_naming_both():
    def f(state, cfg):
        state["init"] = cfg["init"]  # the same object at an unmapped and a mapped place

    state, cfg = {"w": jnp.zeros((B, 2))}, {"init": jnp.ones(2)}
    with pytest.raises(ValueError) as info:
        tc.vmap(f, in_axes=(0, None), policy="alias")(state, cfg)
    assert "state['init']" in str(info.value) and "cfg['init']" in str(info.value)
    assert "jnp.copy" in str(info.value)
    assert list(state) == ["w"]


def test_returned_input_is_the_callers_object_and_out_axes_must_agree_with_it():
    def f(state, x):
        state["h"] = state["h"] + x
        return state, x * 2

    state = {"h": jnp.zeros((B, 3))}
    got, doubled = tc.vmap(f, policy="alias")(state, XS)
    assert got is state
    assert_same_values(state, {"h": XS})
    assert_same_values(doubled, XS * 2)

    moved = {"h": jnp.zeros((3, B))}
    with pytest.raises(ValueError, match=r"result\[0\]\['h'\]: out_axes gives this place"):
        tc.vmap(f, in_axes=(1, 0), policy="alias")(moved, XS)
    assert_same_values(moved, {"h": np.zeros((3, B))})
    got, _ = tc.vmap(f, in_axes=(1, 0), out_axes=(1, 0), policy="alias")(moved, XS)
    assert got is moved
    assert_same_values(moved, {"h": np.asarray(XS).T})


def test_out_axes_are_applied_to_new_values_and_returned_input_arrays():
    def f(x, c):
        return {"x": x, "c": c, "y": x + c}

    c = jnp.array([1.0, 2.0, 3.0])
    options = {"in_axes": (0, None), "out_axes": {"x": 1, "c": 0, "y": None}}
    with pytest.raises(ValueError, match=r"result\['y'\]: vmap has mapped output"):
        tc.vmap(f, **options, policy="alias")(XS, c)
    options["out_axes"]["y"] = 0
    got = tc.vmap(f, **options, policy="alias")(XS, c)
    assert_same_values(got, jax.vmap(f, **options)(XS, c))
    same = tc.vmap(lambda x: {"x": x}, policy="alias")(XS)
    assert same["x"] is XS  # an input returned along its own axis is the caller's array

    def twice(x):
        y = x * 2
        return y, y, x  # one value at two places of different axes: each gets its own

    options = {"out_axes": (0, 1, 1)}
    assert_same_values(
        tc.vmap(twice, **options, policy="alias")(XS), jax.vmap(twice, **options)(XS)
    )


def test_unmapped_values_that_are_not_arrays_pass_through_as_under_jax_vmap():
    def f(cfg, x):
        cfg["calls"] = cfg["calls"] + 1  # a Python int, unbatched: written once
        return x * cfg["scale"] if cfg["name"] == "double" else x

    cfg = {"name": "double", "scale": 2.0, "calls": 0, "nothing": None}
    got = tc.vmap(f, in_axes=(None, 0), policy="alias")(cfg, XS)
    want = jax.vmap(f, in_axes=(None, 0))(dict(cfg), XS)
    assert_same_values(got, want)
    assert cfg == {"name": "double", "scale": 2.0, "calls": 1, "nothing": None}


def test_in_axes_prefix_tree_and_keyword_arguments():
    def f(params, x, *, extra):
        params["stats"]["n"] = params["stats"]["n"] + 1
        return params["w"] @ x + extra

    params = {"w": jnp.ones((2, 3)), "stats": {"n": jnp.zeros(B)}}
    extra = jnp.arange(B * 2.0).reshape(B, 2)  # keyword arguments are mapped along 0
    in_axes = ({"w": None, "stats": 0}, 0)
    want = jax.vmap(f, in_axes=in_axes)(copy.deepcopy(params), XS, extra=extra)
    got = tc.vmap(f, in_axes=in_axes, policy="alias")(params, XS, extra=extra)
    assert_same_values(got, want)
    np.testing.assert_array_equal(params["stats"]["n"], np.ones(B))
    np.testing.assert_array_equal(params["w"], np.ones((2, 3)))


def test_a_new_key_where_in_axes_gives_no_single_axis_is_an_error():
    def f(params):
        params["new"] = params["a"] * 2

    params = {"a": jnp.ones(B), "b": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"params\['new'\]: .*f put a new value where in_axes"):
        tc.vmap(f, in_axes=({"a": 0, "b": None},), policy="alias")(params)
    assert list(params) == ["a", "b"]


def test_the_same_array_at_two_places_is_one_input_with_one_axis():
    x = jnp.arange(B * 3.0).reshape(B, 3)
    seen = {}

    def f(a, b):
        seen["same"] = a is b
        return a + b

    got = tc.vmap(f, policy="alias")(x, x)
    assert seen["same"] and np.allclose(got, 2 * x)
    with pytest.raises(ValueError, match=r"vmap in_axes: a and b are the same value"):
        tc.vmap(f, in_axes=(0, 1), policy="alias")(x, x)
    shared: dict = {"log": []}  # a container without leaves: the container itself conflicts
    with pytest.raises(ValueError, match=r"p\['log'\] is one object reached from places given"):
        tc.vmap(lambda p, q, x: x, in_axes=(0, None, 0), policy="alias")(shared, [shared], x)


def test_sizes_and_ranks_are_checked_naming_the_key_paths():
    f = tc.vmap(lambda s, x: x, policy="alias")
    with pytest.raises(ValueError, match=r"inconsistent sizes[\s\S]*s\['w'\]"):
        f({"w": jnp.ones(3)}, XS)
    with pytest.raises(ValueError, match=r"map its argument s\['w'\] along axis 0.*rank"):
        f({"w": jnp.ones(())}, XS)
    with pytest.raises(ValueError, match="at least one non-None value in in_axes"):
        tc.vmap(lambda x: x, in_axes=None, policy="alias")(XS)


def test_a_new_value_of_too_small_rank_for_its_places_axis_is_named():
    def f(state, x):
        state["s"] = x.sum()  # rank 0 per example; the state is mapped along axis 1

    state = {"h": jnp.zeros((3, B))}
    with pytest.raises(ValueError, match=r"state\['s'\]: the batch axis of this place is 1"):
        tc.vmap(f, in_axes=(1, 0), policy="alias")(state, XS)


def test_axis_name_and_axis_size():
    def f(stats, x):
        stats["mean"] = jax.lax.pmean(x, "batch")  # the same for every example
        return x - stats["mean"]

    stats = {"mean": jnp.zeros(3)}
    got = tc.vmap(f, in_axes=(None, 0), axis_name="batch", policy="alias")(stats, XS)
    np.testing.assert_allclose(stats["mean"], XS.mean(0), rtol=1e-6)
    np.testing.assert_allclose(got, XS - XS.mean(0), rtol=1e-6)

    counter = {"i": jnp.zeros((), jnp.int32)}

    def index(counter):
        counter["i"] = counter["i"] + jax.lax.axis_index("b")  # batched: an error
        return jax.lax.axis_index("b")

    with pytest.raises(ValueError, match=r"counter\['i'\]"):
        tc.vmap(index, in_axes=None, axis_size=3, axis_name="b", policy="alias")(counter)
    got = tc.vmap(lambda c: jax.lax.axis_index("b"), in_axes=None, axis_size=3, axis_name="b")
    np.testing.assert_array_equal(got(counter), [0, 1, 2])


def test_alias_raising_function_leaves_the_caller_untouched():
    def f(state, x):
        state["count"] = state["count"] + 1
        raise RuntimeError("boom")

    state = _state()
    before = numpy_copy(state)
    with pytest.raises(RuntimeError, match="boom"):
        tc.vmap(f, policy="alias")(state, XS)
    assert_same_values(state, before)


def test_policy_block_overrides_and_decorator_form():
    @tc.vmap(in_axes=(0, None, 0), policy="clone")
    def g(state, cfg, x):
        return step(state, cfg, x)

    assert g.__name__ == "g" and "vmap of" in repr(g)
    state = _state()
    with tc.policy("strict"), pytest.raises(tc.MutationError):
        g(state, _cfg(), XS)
    with tc.policy("alias"):
        g(state, _cfg(), XS)
    np.testing.assert_array_equal(state["count"], np.ones(B))


# --- strict ---------------------------------------------------------------------------------


def test_strict_unreturned_mutation_names_the_argument_and_key_path():
    state = _state()
    before = numpy_copy(state)
    with pytest.raises(tc.MutationError) as info:
        tc.vmap(step, in_axes=(0, None, 0), policy="strict")(state, _cfg(), XS)
    message = str(info.value)
    assert "state['total']: replaced" in message and "key added: 'new'" in message
    assert_same_values(state, before)


def test_strict_returned_mutation_is_allowed_and_caller_untouched():
    def f(state, cfg, x):
        return step(state, cfg, x), state

    state = _state()
    before = numpy_copy(state)
    want_state, want_result = python_loop(step, numpy_copy(state), numpy_copy(_cfg()), XS)
    result, new_state = tc.vmap(f, in_axes=(0, None, 0), policy="strict")(state, _cfg(), XS)
    assert new_state is not state
    assert_same_values(new_state, want_state)
    assert_same_values(result, want_result)
    assert_same_values(state, before)


# --- nesting ----------------------------------------------------------------------------------


def loss(w, stats, x):
    stats["calls"] = stats["calls"] + 1
    stats["last"] = jnp.tanh(w * x)
    return jnp.sum(jnp.tanh(w * x) ** 2)


def _loss_stats():
    return {"calls": jnp.zeros(B), "last": jnp.zeros((B, 3))}


W = jnp.array([0.5, -1.0, 2.0])


def functional_loss(w, x):
    return loss(w, {"calls": 0.0, "last": None}, x)


def test_vmap_inside_an_alias_jitted_step():
    traces = []

    @tc.jit(policy="alias")
    def train(w, stats, xs):
        traces.append(1)
        return tc.vmap(loss, in_axes=(None, 0, 0), policy="alias")(w, stats, xs)

    stats = _loss_stats()
    calls = stats["calls"]
    for i in range(1, 3):
        got = train(W, stats, XS)
        np.testing.assert_allclose(got, jax.vmap(functional_loss, (None, 0))(W, XS), rtol=1e-6)
        np.testing.assert_array_equal(stats["calls"], np.full(B, float(i)))
    np.testing.assert_allclose(stats["last"], jnp.tanh(W * XS), rtol=1e-6)
    assert len(traces) == 1 and stats["calls"] is not calls


def test_per_example_gradients_vmap_of_grad():
    stats = _loss_stats()
    per_example = tc.vmap(tc.grad(loss, policy="alias"), in_axes=(None, 0, 0), policy="alias")
    got = per_example(W, stats, XS)
    want = jax.vmap(jax.grad(functional_loss), in_axes=(None, 0))(W, XS)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(stats["calls"], np.ones(B))
    np.testing.assert_allclose(stats["last"], jnp.tanh(W * XS), rtol=1e-6)


def test_grad_of_a_vmapped_loss():
    stats = _loss_stats()

    def total(w, stats, xs):
        return jnp.sum(tc.vmap(loss, in_axes=(None, 0, 0), policy="alias")(w, stats, xs))

    value, g = tc.value_and_grad(total, policy="alias")(W, stats, XS)
    want = jax.value_and_grad(lambda w: jnp.sum(jax.vmap(functional_loss, (None, 0))(w, XS)))(W)
    np.testing.assert_allclose(value, want[0], rtol=1e-6)
    np.testing.assert_allclose(g, want[1], rtol=1e-6)
    np.testing.assert_array_equal(stats["calls"], np.ones(B))
    assert not isinstance(stats["last"], jax.core.Tracer)


def test_vmap_of_vmap():
    def f(state, x):
        state["n"] = state["n"] + x

    state = {"n": jnp.zeros((2, B, 3))}
    xs = jnp.stack([XS, 2 * XS])
    inner = tc.vmap(f, policy="alias")
    tc.vmap(inner, policy="alias")(state, xs)
    np.testing.assert_allclose(state["n"], xs, rtol=1e-6)


def test_cycle_in_arguments_is_the_value_error_of_every_policy():
    cyclic: dict = {"w": jnp.ones(B)}
    cyclic["self"] = cyclic
    for policy in ["clone", "alias", "strict"]:
        with pytest.raises(ValueError, match="cycle detected"):
            tc.vmap(lambda d: d["w"], policy=policy)(cyclic)
