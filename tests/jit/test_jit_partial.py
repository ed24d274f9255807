"""``treeclone.jit_partial``: bound arguments flattened once, calls equal to
``treeclone.jit(fun)(*bound, *args)`` and, under alias, to plain Python on the same objects,
whatever the function or the caller does to the bound objects between calls
(docs/semantics.md, "jit_partial").

Without CPython's internals (``TREECLONE_NO_CPYTHON_INTERNALS=1``, or an interpreter treeclone
has not verified: docs/semantics.md, "CPython internals") nothing is watched and the bound
arguments are flattened at every call: the tests of the watch then check that instead
(``WATCHED``), and every other test holds as it is. CI runs this file both ways.
"""

from __future__ import annotations

import collections
import copy
import importlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from mutation_programs import (
    between_programs,
    bound_trees,
    containers,
    describe,
    programs,
    run_as_alias,
    run_program,
)
from node_kinds import Scaled

# The module, not the function of the same name that ``treeclone.jit_partial`` is.
partial_module = importlib.import_module("treeclone._jit.partial")
# Where the bound arguments are flattened and checked.
bound_module = importlib.import_module("treeclone._jit.bound")

# Whether the snapshot watches the bound arguments (CPython's internals are read here).
WATCHED = tc._native.cpython_internals()[0] == "on"


def assert_never_trusted(snapshot):
    """Without CPython's internals a snapshot records nothing: it is never checkable, never
    unchanged, so the bound arguments are flattened at every call."""
    assert not snapshot.checkable and not snapshot.unchanged()


def values(tree):
    return jax.tree.map(lambda x: np.asarray(x).tolist(), tree)


def sgd_step(state, x):
    state["w"] = state["w"] - 0.1 * x
    state["count"] = state["count"] + 1
    return state["w"].sum()


def fresh_state():
    return {"w": jnp.ones(3), "count": jnp.zeros((), jnp.int32)}


def test_alias_steps_equal_plain_python_on_the_callers_objects():
    state, plain = fresh_state(), fresh_state()
    step = tc.jit_partial(sgd_step, state)
    for i in range(4):
        got = step(jnp.full(3, float(i)))
        want = sgd_step(plain, jnp.full(3, float(i)))
        assert float(got) == pytest.approx(float(want))
    assert values(state) == values(plain)


def test_returned_bound_argument_is_the_callers_object():
    state = fresh_state()
    step = tc.jit_partial(lambda s, x: (s, x * 2), state)
    returned, _ = step(1.0)
    assert returned is state


def test_a_leaf_replaced_between_calls_is_used():
    state = fresh_state()
    step = tc.jit_partial(sgd_step, state)
    step(jnp.ones(3))
    state["w"] = jnp.full(3, 10.0)
    step(jnp.ones(3))
    assert values(state["w"]) == pytest.approx([9.9] * 3)


def test_a_key_added_between_calls_is_part_of_the_next_call():
    state = fresh_state()

    def f(s):
        return sum(v.sum() for v in s.values())

    total = tc.jit_partial(f, state)
    assert float(total()) == 3.0
    state["extra"] = jnp.full(2, 5.0)
    assert float(total()) == 13.0


def test_the_function_growing_a_bound_list_is_followed():
    history = []
    push = tc.jit_partial(lambda h, x: h.append(x * 2), history)
    for i in range(3):
        push(float(i))
    assert values(history) == [0.0, 2.0, 4.0]


# Flattens of the registered nodes below, by class name: counted outside the classes (a class
# written at each flatten has a new version each time, which the snapshot takes for a change).
FLATTENS: collections.Counter[str] = collections.Counter()


class Counted:
    """A registered node that counts its flattens."""

    def __init__(self, w, b):
        self.w, self.b = w, b


def _flatten_counted(c):
    FLATTENS["Counted"] += 1
    return (c.w, c.b), None


jax.tree_util.register_pytree_node(Counted, _flatten_counted, lambda _, ch: Counted(*ch))


def test_bound_arguments_are_not_flattened_again_at_each_call(monkeypatch):
    """The bound arguments are flattened once; a registered node whose flatten is Python code
    (which may read more than the snapshot watches) has that flatten run again, its own level
    only, at each check, and its children and aux data compared."""
    whole = collections.Counter()
    original = bound_module.BoundArguments.flatten

    def counted(self):
        whole["bound"] += 1
        original(self)

    monkeypatch.setattr(bound_module.BoundArguments, "flatten", counted)
    layer = Counted(jnp.ones(2), jnp.zeros(2))

    def step(c, x):
        c.w = c.w + x  # written back every call: the kept leaves and the record follow it

    update = tc.jit_partial(step, layer)
    update(1.0)  # traced: flattened as often as tracing needs
    before, bound_before = FLATTENS["Counted"], whole["bound"]
    # Without CPython's internals: the whole bound arguments at every call; with them, the
    # node's own flatten once per call (the check), and nothing else.
    for _ in range(3):
        update(1.0)
    assert FLATTENS["Counted"] == before + 3
    assert whole["bound"] == bound_before + (0 if WATCHED else 3)
    assert values(layer.w) == [5.0, 5.0]
    layer.b = jnp.ones(2)  # a change between calls: flattened again, once
    update(1.0)
    assert FLATTENS["Counted"] == before + 4 + WATCHED
    assert whole["bound"] == bound_before + (1 if WATCHED else 4)
    assert values(layer.w) == [6.0, 6.0]
    if WATCHED:
        assert update._bound.snapshot.flattened_at_each_check == 1


class _BuiltDict:
    def __init__(self, w, b):
        self.w, self.b = w, b


class _BuiltList(_BuiltDict):
    pass


jax.tree_util.register_pytree_node(
    _BuiltDict,
    lambda s: (({"w": s.w, "b": s.b},), None),
    lambda _, c: _BuiltDict(c[0]["w"], c[0]["b"]),
)
jax.tree_util.register_pytree_node(
    _BuiltList, lambda s: (([s.w, s.b],), None), lambda _, c: _BuiltList(*c[0])
)


@pytest.mark.parametrize("built", [_BuiltDict, _BuiltList])
def test_a_flatten_building_a_container_of_its_children_stays_cached(built, monkeypatch):
    """A registered flatten may return its children in a dict or list it builds: new at each
    flatten (so changed after the flatten began), whose items are found among the node's
    attributes. The bound arguments stay cached (the dict was flattened at every call
    once)."""
    flattens = collections.Counter()
    original = bound_module.BoundArguments.flatten

    def counted(self):
        flattens["bound"] += 1
        original(self)

    monkeypatch.setattr(bound_module.BoundArguments, "flatten", counted)
    node = built(jnp.ones(2), jnp.zeros(2))
    p = tc.jit_partial(lambda n, x: (n.w + n.b).sum() * x, node)
    p(1.0), p(1.0)  # the first reads the node's __dict__ first: flattened once more
    before = flattens["bound"]
    assert [float(p(1.0)) for _ in range(3)] == [2.0] * 3
    if not WATCHED:
        assert_never_trusted(p._bound.snapshot)
        return
    assert flattens["bound"] == before and p._bound.snapshot.checkable


def test_static_data_changed_between_calls_is_used():
    layer = Scaled(jnp.ones(2), 2.0)
    apply = tc.jit_partial(lambda m, x: m.w * m.scale * x, layer)
    assert values(apply(1.0)) == [2.0, 2.0]
    layer.scale = 3.0
    assert values(apply(1.0)) == [3.0, 3.0]


class Slotted:
    __slots__ = ("__hidden", "w")

    def __init__(self, w):
        self.w = w
        self.__hidden = 0


jax.tree_util.register_pytree_node(
    Slotted, lambda s: ((s.w,), None), lambda _, children: Slotted(children[0])
)


def test_a_slot_set_between_calls_is_used():
    obj = Slotted(jnp.ones(2))
    double = tc.jit_partial(lambda s: s.w * 2, obj)
    assert values(double()) == [2.0, 2.0]
    obj.w = jnp.full(2, 4.0)
    assert values(double()) == [8.0, 8.0]


def test_an_argument_reachable_from_the_bound_ones_is_the_same_object_inside():
    inner = {"w": jnp.ones(2)}
    outer = {"inner": inner}

    def f(o, i, x):
        i["w"] = i["w"] + x
        return o["inner"] is i

    step = tc.jit_partial(f, outer, policy="alias")
    assert bool(step(inner, 1.0))
    assert values(outer["inner"]["w"]) == [2.0, 2.0] and outer["inner"] is inner
    step(inner, 1.0)  # the bound leaves follow the write made through the other argument
    assert values(inner["w"]) == [3.0, 3.0]


def test_a_part_of_the_bound_model_passed_at_the_call_under_the_default_policy():
    """The documented ``p(model.layer)`` with ``model`` bound, under jit_partial's default
    (bound ``alias``, the others ``clone``): the layer is bound data, so it follows the bound
    model (rule P5) and the call does what plain Python does on the same objects; it was rule
    P4's ValueError (issue 57)."""

    def step(model, layer, x):
        layer["w"] = layer["w"] * x
        model["count"] = model["count"] + 1
        return model["layer"] is layer, (layer,)

    model = {"layer": {"w": jnp.ones(2)}, "count": jnp.zeros(())}
    plain = {"layer": {"w": np.ones(2)}, "count": np.zeros(())}
    p = tc.jit_partial(step, model)
    layer = model["layer"]
    for x in (2.0, 3.0, 0.5):
        same, (out_layer,) = p(model["layer"], x)
        plain_same, _ = step(plain, plain["layer"], x)
        assert bool(same) and plain_same and out_layer is layer
        assert values(model) == values(plain) and model["layer"] is layer
    assert values(layer["w"]) == [3.0, 3.0]


def test_a_container_replaced_by_an_equal_one_is_followed():
    """One trace puts a new dict of the same structure in place of the old one; another
    (a different static argument) updates that dict in place: the update must reach the dict
    the caller holds now, as in plain Python, not the one that was bound first."""
    state = {"sub": {"w": jnp.zeros(2)}}
    plain = {"sub": {"w": np.zeros(2)}}

    def step(s, x, replace):
        if replace:
            s["sub"] = {"w": s["sub"]["w"] + x}
        else:
            s["sub"]["w"] = s["sub"]["w"] + x
        return s["sub"]

    update = tc.jit_partial(step, state, static_argnums=2)
    for i, replace in enumerate([True, False, True, False, False]):
        sub = update(float(i), replace)
        plain_sub = step(plain, float(i), replace)
        assert sub is state["sub"] and values(sub) == values(plain_sub)
    assert values(state) == values(plain)


def test_tied_weights_stay_tied():
    shared = {"w": jnp.ones(2)}
    model = {"encoder": shared, "decoder": shared}

    def f(m, x):
        m["encoder"]["w"] = m["encoder"]["w"] + x
        return m["decoder"]["w"]

    step = tc.jit_partial(f, model)
    assert values(step(1.0)) == [2.0, 2.0]
    assert model["encoder"] is model["decoder"] is shared
    assert values(step(1.0)) == [3.0, 3.0]


def test_strict_names_the_bound_argument_mutated_and_not_returned():
    state = fresh_state()
    step = tc.jit_partial(sgd_step, state, policy="strict")
    with pytest.raises(tc.MutationError, match=r"state\['w'\]"):
        step(jnp.ones(3))
    assert values(state) == values(fresh_state())


def test_clone_is_refused_with_the_alternative():
    with pytest.raises(ValueError, match="preserves identity"):
        tc.jit_partial(sgd_step, fresh_state(), policy="clone")


def test_a_bound_argument_cannot_be_static():
    with pytest.raises(ValueError, match="cannot be static"):
        tc.jit_partial(sgd_step, fresh_state(), static_argnums=0)


def test_static_and_donated_arguments_after_the_bound_ones():
    state = fresh_state()

    def f(s, x, n):
        s["w"] = s["w"] * n + x
        return n

    step = tc.jit_partial(f, state, static_argnums=2, donate_argnums=0)
    assert step(jnp.ones(3), 2) == 2
    assert step(jnp.ones(3), 2) == 2
    assert values(state["w"]) == [7.0, 7.0, 7.0]


def test_one_trace_for_repeated_calls():
    state = fresh_state()
    traces = []

    def f(s, x):
        traces.append(1)
        return sgd_step(s, x)

    step = tc.jit_partial(f, state)
    for _ in range(5):
        step(jnp.ones(3))
    assert len(traces) == 1


# Each example traces and compiles: a fraction of the profile's budget, scaled with it
# (60 under ci; tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(bound_trees, programs, between_programs)
def test_alias_equals_plain_python_with_changes_inside_and_between_calls(tree, inside, between):
    """Each round runs ``inside`` in the function, then ``between`` on the caller's objects;
    every original container must end as its plain-Python twin does (seeing dicts sorted inside
    the function, as the function does: ``run_as_alias``). Between calls, besides what the
    function may do, dicts are reordered in place (``OrderedDict.move_to_end``), ``__dict__``
    replaced, ``__class__`` reassigned, and the dict a ``Stored`` node's flatten reads
    changed."""
    expected = copy.deepcopy(tree)
    expected_nodes = containers(expected)
    mine = copy.deepcopy(tree)
    mine_nodes = containers(mine)
    step = tc.jit_partial(lambda t: run_program(t, inside), mine)
    for _ in range(3):
        run_as_alias(expected, inside)
        run_program(expected, between)
        step()
        run_program(mine, between)
    expected_index = {id(n): i for i, n in enumerate(expected_nodes)}
    mine_index = {id(n): i for i, n in enumerate(mine_nodes)}
    for got, want in zip(mine_nodes, expected_nodes, strict=True):
        assert describe(got, mine_index) == describe(want, expected_index), (inside, between)


nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

from nnx_models import ReluBlock  # noqa: E402 - after the skips


def _model_and_optimizer(tied=False):
    model = nnx.Sequential(ReluBlock(4, 4, rngs=nnx.Rngs(0)), ReluBlock(4, 4, rngs=nnx.Rngs(1)))
    if tied:  # one Variable in two places
        model.layers[1].linear.kernel = model.layers[0].linear.kernel
    return model, nnx.Optimizer(model, optax.sgd(0.05, momentum=0.9), wrt=nnx.Param)


def _train_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return loss


def test_nnx_training_equals_plain_nnx_and_nnx_jit_partial():
    x = jax.random.normal(jax.random.PRNGKey(2), (8, 4))
    mine, plain, theirs = (_model_and_optimizer() for _ in range(3))
    step = tc.jit_partial(_train_step, *mine)
    their_step = nnx.jit_partial(_train_step, *theirs, graph=False)
    for _ in range(3):
        loss = step(x)
        plain_loss = _train_step(*plain, x)
        their_loss = their_step(x)
        assert float(loss) == pytest.approx(float(plain_loss), rel=1e-5)
        assert float(loss) == pytest.approx(float(their_loss), rel=1e-5)
    leaves = [jax.tree.leaves(nnx.state(m)) for m in (mine, theirs, plain)]
    for got, their, want in zip(*leaves, strict=True):
        assert np.allclose(got, their, atol=1e-6)  # both compiled
        assert np.allclose(got, want, atol=1e-4)  # eager: other rounding
    assert int(mine[1].step[...]) == 3


def test_nnx_shared_variable_is_supported_where_nnx_jit_partial_refuses_it():
    model, optimizer = _model_and_optimizer(tied=True)
    x = jax.random.normal(jax.random.PRNGKey(2), (8, 4))
    with pytest.raises(Exception):  # noqa: B017 - nnx's own refusal, whatever its type
        nnx.jit_partial(_train_step, model, optimizer, graph=False)(x)
    plain_model, plain_optimizer = _model_and_optimizer(tied=True)
    step = tc.jit_partial(_train_step, model, optimizer)
    for _ in range(2):
        loss = step(x)
        plain_loss = _train_step(plain_model, plain_optimizer, x)
        assert float(loss) == pytest.approx(float(plain_loss), rel=1e-5)
    assert model.layers[1].linear.kernel is model.layers[0].linear.kernel
    assert np.allclose(model.layers[0].linear.kernel[...], plain_model.layers[0].linear.kernel[...])


def test_nnx_eval_mode_set_between_calls_is_used():
    model, _ = _model_and_optimizer()
    x = jax.random.normal(jax.random.PRNGKey(2), (8, 4))
    forward = tc.jit_partial(lambda m, x: m(x), model)
    forward(x)
    model.eval()  # BatchNorm uses its running averages from now on: static data changed
    assert np.allclose(forward(x), model(x), atol=1e-5)


@pytest.mark.parametrize("when", ["at_creation", "between_calls"])
def test_a_cycle_in_a_bound_argument_names_the_argument(when):
    """Rule J17: the same ValueError text as treeclone.jit's, naming the argument (``state``),
    whether the bound argument holds the cycle when bound or is given one between calls."""

    def step(state, x):
        return state["w"] * x

    state = {"w": jnp.ones(2)}
    if when == "at_creation":
        state["loop"] = [state]
        with pytest.raises(ValueError) as ours:
            tc.jit_partial(step, state)
    else:
        p = tc.jit_partial(step, state)
        np.testing.assert_array_equal(p(2.0), [2.0, 2.0])
        state["loop"] = [state]
        with pytest.raises(ValueError) as ours:
            p(2.0)
    with pytest.raises(ValueError) as theirs:
        tc.jit(step, policy="alias")(state, 2.0)
    assert str(ours.value) == str(theirs.value)
    assert "the dict at state contains itself at relative key path ['loop'][0]" in str(ours.value)


def test_a_written_back_leaf_passed_again_is_the_bound_object():
    """After a call writes a bound leaf, the new array passed back as an argument is the bound
    object inside (``s["w"] is x``), as in plain Python and under treeclone.jit (rule J8), and
    with that argument donated it is not donated, since the bound state keeps it (rule J13),
    where XLA's "Attempt to donate a buffer which is also used by the same call" escaped."""

    def step(s, x):
        same = s["w"] is x
        s["w"] = s["w"] + x
        return same

    plain = {"w": jnp.ones(2)}  # the plain Python program on its own state
    expected = [step(plain, jnp.ones(2)), step(plain, plain["w"]), step(plain, plain["w"])]
    assert expected == [False, True, True]
    state = {"w": jnp.ones(2)}
    p = tc.jit_partial(step, state)
    ours = [bool(p(jnp.ones(2))), bool(p(state["w"])), bool(p(state["w"]))]
    assert ours == expected
    np.testing.assert_array_equal(state["w"], plain["w"])

    def update(s, x):
        s["w"] = s["w"] + x

    s = {"w": jnp.ones(2)}
    p = tc.jit_partial(update, s, donate_argnums=1)
    p(jnp.ones(2))
    written = s["w"]
    p(written)  # bound and donated: kept, as treeclone.jit keeps it
    assert not written.is_deleted()
    np.testing.assert_array_equal(s["w"], [4.0, 4.0])


# Between-call changes a by-identity look at the items alone would miss (docs/semantics.md,
# "jit_partial", "Changes made between calls are used, never lost"): each is compared with plain
# Python and with treeclone.jit on the same objects.


class Stored:
    """A registered node whose flatten reads its children from a plain dict in an attribute
    (the dict is not a node of the tree)."""

    def __init__(self, w, b):
        self._store = {"w": w, "b": b}


jax.tree_util.register_pytree_node(
    Stored,
    lambda s: ((s._store["w"], s._store["b"]), None),
    lambda _, children: Stored(*children),
)


def _weighted(s, x):
    return s._store["w"] * x + s._store["b"]


def _three_ways(fun, make, change, *args):
    """``fun(bound, *args)`` after ``change(bound)``, through jit_partial (called once
    before the change), treeclone.jit and plain Python, each on its own objects."""
    ours, theirs, plain = make(), make(), make()
    p = tc.jit_partial(fun, ours)
    p(*args)
    for obj in (ours, theirs, plain):
        change(obj)
    return (
        values(p(*args)),
        values(tc.jit(fun, policy="alias")(theirs, *args)),
        values(fun(plain, *args)),
    )


def test_an_entry_of_a_dict_read_by_a_registered_flatten_changed_between_calls_is_used():
    def change(s):
        s._store["w"] = jnp.full(2, 5.0)

    ours, theirs, plain = _three_ways(
        _weighted, lambda: Stored(jnp.ones(2), jnp.zeros(2)), change, 2.0
    )
    assert ours == theirs == plain == [10.0, 10.0]


class Nested:
    """A registered node reading a child from a list inside a dict held by an attribute."""

    def __init__(self, w):
        self.config = {"layers": [w], "name": "n"}


jax.tree_util.register_pytree_node(
    Nested,
    lambda n: ((n.config["layers"][0],), n.config["name"]),
    lambda name, children: Nested(children[0]),
)


def test_an_item_of_a_nested_container_read_by_a_registered_flatten_is_used():
    def change(n):
        n.config["layers"][0] = jnp.full(2, 3.0)

    ours, theirs, plain = _three_ways(
        lambda n, x: n.config["layers"][0] * x, lambda: Nested(jnp.ones(2)), change, 2.0
    )
    assert ours == theirs == plain == [6.0, 6.0]


def test_an_ordereddict_reordered_between_calls_is_used():
    import collections

    def make():
        return collections.OrderedDict([("a", jnp.ones(1)), ("b", jnp.full(1, 2.0))])

    def change(d):
        d.move_to_end("a")

    ours, theirs, plain = _three_ways(lambda d, x: [v * x for v in d.values()], make, change, 1.0)
    assert ours == theirs == plain == [[2.0], [1.0]]


class Plain:
    def __init__(self, w):
        self.w = w


jax.tree_util.register_pytree_node(Plain, lambda p: ((p.w,), None), lambda _, c: Plain(c[0]))


def test_a_replaced___dict___between_calls_is_used():
    def change(obj):
        obj.__dict__ = {"w": jnp.full(2, 7.0)}

    ours, theirs, plain = _three_ways(lambda o, x: o.w * x, lambda: Plain(jnp.ones(2)), change, 1.0)
    assert ours == theirs == plain == [7.0, 7.0]


class Doubled(Plain):
    """A subclass registered with its own flatten: its static data differs."""


jax.tree_util.register_pytree_node(
    Doubled, lambda p: ((p.w,), "doubled"), lambda _, c: Doubled(c[0])
)


def test_a_reassigned___class___between_calls_is_used():
    def fun(o, x):
        return o.w * x * (2 if type(o) is Doubled else 1)

    def change(obj):
        obj.__class__ = Doubled

    ours, theirs, plain = _three_ways(fun, lambda: Plain(jnp.ones(2)), change, 1.0)
    assert ours == theirs == plain == [2.0, 2.0]


def test_a_slot_hidden_by_a_class_attribute_between_calls_is_used():
    """The class of a slotted node changed between calls: ``w`` now reads another slot. The
    object's slots all hold what they held, so only the class's version shows it."""

    class Shadowed:
        __slots__ = ("other", "w")

        def __init__(self, w):
            self.w, self.other = w, jnp.full(2, 5.0)

    jax.tree_util.register_pytree_node(
        Shadowed, lambda s: ((s.w,), None), lambda _, c: Shadowed(c[0])
    )

    def change(obj):
        hidden = property(lambda s: s.other, lambda s, v: setattr(s, "other", v))
        type(obj).w = hidden  # type: ignore[method-assign]

    ours, theirs, plain = _three_ways(
        lambda o, x: o.w * x, lambda: Shadowed(jnp.ones(2)), change, 2.0
    )
    assert ours == theirs == plain == [10.0, 10.0]


def _class_setting_changed(changes_before=0):
    """``_three_ways`` for a registered flatten that takes its static data from the class (a
    setting every instance shares, ``scale``) set again between calls; the class changed
    ``changes_before`` times first, each change followed by a lookup on it."""

    class Setting:
        scale = 2.0

        def __init__(self, w):
            self.w = w

    for i in range(changes_before):
        Setting.scale = float(i)
        assert Setting.scale == i  # a lookup on the class: a new version, while it gets them
    jax.tree_util.register_pytree_node(
        Setting, lambda a: ((a.w,), type(a).scale), lambda _, c: Setting(c[0])
    )

    def fun(a, x):
        return a.w * x * jax.tree_util.tree_structure(a).node_data()[1]

    def change(obj):
        type(obj).scale = 3.0

    return _three_ways(fun, lambda: Setting(jnp.ones(2)), change, 1.0)


def test_a_class_attribute_read_by_a_flatten_changed_between_calls_is_used():
    """The object holds what it held, only the class's version shows the change."""
    ours, theirs, plain = _class_setting_changed()
    assert ours == theirs == plain == [3.0, 3.0]


def test_a_property_added_to_the_class_between_calls_is_used():
    """A data descriptor set on the class hides the instance attribute a flatten reads."""

    class Switched:
        def __init__(self, w, other):
            self.other, self.w = other, w

    jax.tree_util.register_pytree_node(
        Switched, lambda s: ((s.w,), None), lambda _, c: Switched(c[0], None)
    )

    def change(obj):
        hidden = property(lambda s: s.other, lambda s, v: setattr(s, "other", v))
        type(obj).w = hidden  # type: ignore[method-assign]

    ours, theirs, plain = _three_ways(
        lambda s, x: s.w * x, lambda: Switched(jnp.ones(2), jnp.full(2, 3.0)), change, 2.0
    )
    assert ours == theirs == plain == [6.0, 6.0]


def test_a_leafs_class_registered_as_a_node_between_calls_is_used():
    """JAX's registry only grows; a registration changes what a flatten gives, so the
    snapshot watches the registry's size too (before, the call ran on the old structure and
    failed inside JAX)."""

    class Pair(np.ndarray):
        pass

    def register_once(_):
        if Pair not in registered:
            registered.append(Pair)
            jax.tree_util.register_pytree_node(
                Pair, lambda p: ((np.asarray(p), np.asarray(p)), None), lambda _, c: tuple(c)
            )

    registered: list[type] = []
    ours, theirs, plain = _three_ways(
        lambda s, x: x * len(jax.tree_util.tree_leaves(s)),
        lambda: {"w": jnp.ones(2), "p": np.ones(2).view(Pair)},
        register_once,
        1.0,
    )
    assert ours == theirs == plain == 3.0


def test_a_class_changed_too_often_to_have_a_version_is_still_watched():
    """From 3.12 CPython gives a class no new version after about a thousand changes: the
    snapshot cannot watch such a class, so the bound arguments are flattened at every call
    (on 3.11 the class keeps getting versions, and each change is seen by its version)."""
    ours, theirs, plain = _class_setting_changed(changes_before=1100)
    assert ours == theirs == plain == [3.0, 3.0]


class Holder:
    def __init__(self, w):
        self.w = w


class Indirect:
    """A registered node whose flatten reads its child through another object's attribute:
    out of the snapshot's reach, so the bound arguments are flattened at every call."""

    def __init__(self, w):
        self.holder = Holder(w)


def _flatten_indirect(i):
    FLATTENS["Indirect"] += 1
    return (i.holder.w,), None


jax.tree_util.register_pytree_node(Indirect, _flatten_indirect, lambda _, c: Indirect(c[0]))


def test_a_flatten_reading_state_out_of_reach_is_flattened_at_every_call():
    def change(i):
        i.holder.w = jnp.full(2, 4.0)

    ours, theirs, plain = _three_ways(
        lambda i, x: i.holder.w * x, lambda: Indirect(jnp.ones(2)), change, 1.0
    )
    assert ours == theirs == plain == [4.0, 4.0]
    obj = Indirect(jnp.ones(2))
    p = tc.jit_partial(lambda i, x: i.holder.w * x, obj)
    p(1.0)
    before = FLATTENS["Indirect"]
    p(1.0)
    assert FLATTENS["Indirect"] > before  # never trusted


def test_nnx_variable_metadata_changed_in_place_between_calls_is_used():
    """An nnx Variable's metadata (a dict in a slot) is its static data: changed in place
    between calls, the next call's flatten has it, as treeclone.jit's does."""
    v = nnx.Param(jnp.ones(2))
    seen = []
    p = tc.jit_partial(lambda v: seen.append(v.get_metadata().get("tag")), v)
    p()
    v._var_metadata["tag"] = "new"
    p()
    assert seen == [None, "new"]


def _replacing_step(state, x, mode):
    """``mode`` "replace": new containers for the bound ones (an optax step's
    ``state["params"] = apply_updates(...)``); "update": in place only; "grow": a new key."""
    if mode == "replace":
        state["params"] = {"w": state["params"]["w"] * x}
    elif mode == "update":
        state["params"]["w"] = state["params"]["w"] + x
    else:
        state["params"][f"k{len(state['params'])}"] = x
    return state["params"]["w"].sum()


def test_calls_after_one_that_replaced_bound_containers_equal_jit_and_flatten_once(monkeypatch):
    """After a call that replaced containers of the bound state, the next call flattens the
    bound and the given arguments at once, as jit does, and caching resumes after a call that
    replaces none; the results and the caller's state stay jit's, whatever happens between."""
    ours = {"params": {"w": jnp.ones(2)}}
    theirs = {"params": {"w": jnp.ones(2)}}
    bound = tc.jit_partial(_replacing_step, ours, static_argnames="mode")
    jitted = tc.jit(_replacing_step, policy="alias", static_argnames="mode")
    flattens: list[str] = []
    real = bound_module.BoundArguments.flatten

    def counting(self):
        flattens.append("bound")
        return real(self)

    monkeypatch.setattr(bound_module.BoundArguments, "flatten", counting)
    modes = ["replace", "replace", "update", "update", "outside", "replace", "grow", "update"]
    for i, mode in enumerate(modes):
        if mode == "outside":  # changed between calls: seen by the next call
            for state in (ours, theirs):
                state["params"] = {"w": jnp.full(2, 5.0)}
            continue
        flattens.clear()
        replaced_before = bound._bound.replaced
        got = bound(2.0, mode=mode)
        counted = list(flattens)
        want = jitted(theirs, 2.0, mode=mode)
        np.testing.assert_allclose(got, want)
        assert values(ours) == values(theirs), (i, mode)
        if i == 1:  # after a replacing call: one flatten of everything, as jit's one
            # (the join flattens the bound and the given arguments together when the last
            # call replaced bound containers: the bound ones are not flattened apart first)
            assert replaced_before and counted == [], counted


def _step_by_structure(state, x):
    """``_replacing_step`` with the mode given by the structure of ``x`` (no static argument,
    so that calls take the lean path): a tuple replaces, a list updates, a dict grows."""
    mode = {tuple: "replace", list: "update", dict: "grow"}[type(x)]
    return _replacing_step(state, jax.tree.leaves(x)[0], mode)


def test_replacing_calls_on_the_native_path_equal_jit(monkeypatch):
    """Calls run natively (``PartialCore``: no ``_call_bound``), jit's lean path while every
    call replaces containers of the bound state and the bound arguments' cache otherwise; the
    results and the caller's state stay jit's through replacing, updating and growing calls,
    changes made between calls, and a ``with treeclone.policy`` block, whose first call takes
    the Python path (which checks the policy)."""
    ours = {"params": {"w": jnp.ones(2)}}
    theirs = {"params": {"w": jnp.ones(2)}}
    bound = tc.jit_partial(_step_by_structure, ours)
    jitted = tc.jit(_step_by_structure, policy="alias")
    python_calls: list[int] = []
    real = bound._call_bound

    def counting(*args, **kwargs):
        python_calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(bound, "_call_bound", counting)
    two = jnp.full((), 2.0)
    args = {"replace": (two,), "update": [two], "grow": {"g": two}}
    modes = ["replace", "replace", "replace", "update", "update", "replace", "outside"]
    modes += ["replace", "grow", "replace", "replace", "update"]
    native = []
    for i, mode in enumerate(modes):
        if mode == "outside":  # changed between calls: seen by the next call
            for state in (ours, theirs):
                state["params"] = {"w": jnp.full(2, 5.0), "v": jnp.zeros(3)}
            continue
        python_calls.clear()
        got = bound(args[mode])
        native.append(not python_calls)
        want = jitted(theirs, args[mode])
        np.testing.assert_allclose(got, want)
        assert values(ours) == values(theirs), (i, mode)
    # Native at every call but the first, which checks the policy.
    assert native == [False] + [True] * 10
    with tc.policy("strict"):  # the block's policy, on the Python path
        with pytest.raises(tc.MutationError, match=r"params"):
            bound(args["replace"])
    assert python_calls


class Tagged:
    """A registered node whose static data is read from a plain list in an attribute."""

    def __init__(self, w, tags):
        self.w, self.tags = w, tags


class SlottedTagged:
    __slots__ = ("tags", "w")

    def __init__(self, w, tags):
        self.w, self.tags = w, tags


for _cls in (Tagged, SlottedTagged):
    jax.tree_util.register_pytree_node(
        _cls, lambda s: ((s.w,), tuple(s.tags)), lambda tags, ch, c=_cls: c(ch[0], list(tags))
    )


@pytest.mark.parametrize("cls", [Tagged, SlottedTagged], ids=["__dict__", "__slots__"])
def test_the_snapshot_follows_the_write_back_and_nothing_else(cls):
    """What jit_partial's check does after each call (``Snapshot.refresh`` with the trace's
    record of the written nodes, the same tuple at every call, and the call's bound leaves):
    the record takes, in place of each bound leaf, what the write-back left in its place, and
    reads nothing from the objects, so whatever else changed them shows at the next check."""
    obj = cls(jnp.ones(2), ["a"])
    leaves, sdef, objects = tc._native.flatten_shared(obj)
    snapshot = tc._native.Snapshot.take(objects, sdef, leaves)
    if not WATCHED:
        assert_never_trusted(snapshot)
        return
    written = (len(objects) - 1,)  # the node itself, the root
    new = jnp.zeros(2)
    obj.w = new  # what a write-back does
    snapshot.refresh(written, [new])  # where the write-back left the bound leaf
    assert snapshot.unchanged()
    obj.tags.append("b")  # the watch of the attribute-held list sees this
    assert not snapshot.unchanged()
    obj.tags.pop()
    assert snapshot.unchanged()
    obj.w = jnp.ones(2)  # not the write-back's: seen, a refresh after it notwithstanding
    snapshot.refresh(written, [new])  # the same tuple: its positions are reused
    assert not snapshot.unchanged()
    other = jnp.full(2, 3.0)
    obj.w = other
    snapshot.refresh(list(written), [other])  # any sequence of node indices
    assert snapshot.unchanged()
    obj.tags = ["c"]  # a plain container replaced (never by a write-back): seen
    snapshot.refresh(written, [other])
    assert not snapshot.unchanged()


class _Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


class _SlotPair:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


class _Pausing:
    """A node whose flatten, in Python, waits once for another thread's change: any Python
    code a flatten runs can let another thread run there."""

    def __init__(self, entered, done):
        self.entered, self.done = entered, done


def _pausing_flatten(node):
    if node.entered is not None and not node.entered.is_set():
        node.entered.set()
        node.done.wait(10)
    return (), None


for _cls in (_Pair, _SlotPair):
    jax.tree_util.register_pytree_node(
        _cls, lambda p: ((p.a, p.b), None), lambda _, c, cls=_cls: cls(*c)
    )
jax.tree_util.register_pytree_node(_Pausing, _pausing_flatten, lambda _, c: _Pausing(None, None))


def _swap(pair):
    pair.a, pair.b = pair.b, pair.a


_NO_DICT_VERSIONS = pytest.mark.skipif(
    WATCHED and sys.version_info >= (3, 13),
    reason="3.13 keeps no dict versions: this window stays open",
)
_DURING_THE_FLATTEN = {
    "dict item": lambda t: t["d"].__setitem__("a", jnp.full(2, 5.0)),
    "list item": lambda t: t["l"].__setitem__(0, jnp.full(2, 5.0)),
    "static attribute": lambda t: setattr(t["s"], "scale", 3.0),
    "attributes swapped": lambda t: _swap(t["p"]),
    "slots swapped": lambda t: _swap(t["q"]),
}
_OPEN = {
    "static attribute": _NO_DICT_VERSIONS,
    "attributes swapped": _NO_DICT_VERSIONS,
    # "slots swapped": closed since a node whose flatten is Python code is flattened again at
    # each check (its children compared), slots or not.
}


@pytest.mark.parametrize(
    "change", [pytest.param(name, marks=_OPEN.get(name, ())) for name in _DURING_THE_FLATTEN]
)
def test_a_change_by_another_thread_during_the_flatten_is_used(change):
    """Another thread changes containers the flatten of the bound arguments has read while
    a later node's flatten (Python code) runs: the snapshot, taken after the flatten, must
    not record the change as seen, or every later call uses what the flatten read. Caught by
    each dict's and list's children (the very keys and values) and by dict versions; before,
    each of these was used stale by every call."""
    import threading

    entered, done = threading.Event(), threading.Event()
    tree = {
        "d": {"z": jnp.ones(2), "a": jnp.ones(2)},  # out of sorted order
        "l": [jnp.ones(2)],
        "p": _Pair(jnp.ones(2), jnp.full(2, 2.0)),
        "q": _SlotPair(jnp.ones(2), jnp.full(2, 2.0)),
        "s": Scaled(jnp.ones(2), 2.0),
        "z": _Pausing(entered, done),  # flattened last (keys are sorted)
    }
    for obj in (tree["p"], tree["s"], tree["z"]):
        # Read once, as an earlier flatten would have: an attribute dict read first by the
        # snapshot is made then, and is new, so no version vouches for it (one flatten more).
        vars(obj)

    def fun(t, x):
        p, q = t["p"], t["q"]
        pairs = (p.a - 2 * p.b + 3 * q.a - 4 * q.b).sum()
        return (t["d"]["a"].sum() + t["l"][0].sum() + t["s"].w.sum() * t["s"].scale + pairs) * x

    def write():
        entered.wait(10)
        _DURING_THE_FLATTEN[change](tree)
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    p = tc.jit_partial(fun, tree)  # its flatten waits for the thread's change
    thread.join()
    assert [float(p(1.0)) for _ in range(2)] == [float(fun(tree, 1.0))] * 2


def test_a_write_by_another_thread_during_a_call_is_used_by_the_next():
    """Another thread sets an entry of a bound dict, once, while a call that writes other
    entries of the same dict runs: the next call must use it, as treeclone.jit's would. The
    snapshot's refresh after the write-back once read the dict again and took the thread's
    entry for part of the cache (29 of 50 runs lost it)."""
    import threading

    def step(s, x):
        s["w"] = s["w"] + x
        return s["lr"] * 1.0

    lost = 0
    for _ in range(50):
        state = {"w": jnp.zeros(1000), "lr": jnp.array(1.0)}
        p = tc.jit_partial(step, state, policy="alias")
        p(1.0)
        go = threading.Event()

        def write(state=state, go=go):
            go.wait()
            state["lr"] = jnp.array(2.0)

        thread = threading.Thread(target=write)
        thread.start()
        go.set()
        p(1.0)  # the thread writes while this call runs (or before it)
        thread.join()
        lost += float(p(1.0)) != 2.0
    assert lost == 0


def _store_w(obj, value, times=1):
    """``obj.w = value``: run often enough that the interpreter specializes the store."""
    for _ in range(times):
        obj.w = value


def _set_key(d, value, times=1):
    for _ in range(times):
        d["k"] = value


@pytest.mark.parametrize(
    "change",
    [
        lambda obj: setattr(obj, "w", jnp.zeros(2)),
        lambda obj: object.__setattr__(obj, "w", jnp.zeros(2)),
        lambda obj: setattr(obj, "late", 1),
        lambda obj: delattr(obj, "extra"),
        lambda obj: _store_w(obj, jnp.zeros(2)),  # the specialized store (warmed up below)
        lambda obj: vars(obj).update(w=jnp.zeros(2)),
        lambda obj: vars(obj).pop("extra"),
        lambda obj: vars(obj).clear(),
        lambda obj: obj.tags.__setitem__("k", 2),
        lambda obj: _set_key(obj.tags, 2),  # the specialized subscript store
        lambda obj: obj.tags.setdefault("new", 1),
        lambda obj: obj.tags.popitem(),
    ],
)
def test_every_change_to_a_watched_dict_is_seen(change):
    """The snapshot compares a watched dict (an object's ``__dict__``, made by the first
    ``vars()``; a plain dict under an attribute) by CPython's version tag where that tag
    changes with every change (3.11 and 3.12), item by item elsewhere: every way of changing
    one, the interpreter's specialized stores included, is seen."""

    class Holder:
        def __init__(self, w, tags):
            self.w, self.tags, self.extra = w, tags, 0

    jax.tree_util.register_pytree_node(
        Holder,
        lambda s: ((s.w,), tuple(sorted(s.tags.items()))),
        lambda tags, ch: Holder(ch[0], dict(tags)),
    )
    warm = Holder(jnp.ones(2), {"k": 1})
    vars(warm)
    _store_w(warm, jnp.ones(2), 100)
    _set_key(warm.tags, 1, 100)
    obj = Holder(jnp.ones(2), {"k": 1, "j": 0})
    vars(obj)  # the instance dict made, as the snapshot's own read makes it
    leaves, sdef, objects = tc._native.flatten_shared(obj)
    snapshot = tc._native.Snapshot.take(objects, sdef, leaves)
    if not WATCHED:
        assert_never_trusted(snapshot)
        return
    assert snapshot.unchanged()
    change(obj)
    assert not snapshot.unchanged()


def test_the_bound_leaves_helpers_read_by_identity_and_check_their_indices():
    """``any_identical`` (a call's arguments against the bound leaves) and ``Taker`` (where
    the write-back left each bound leaf), the two native helpers ``advance`` and ``join`` run
    over every bound leaf at each call."""
    from treeclone._native import Taker, any_identical

    a, b, c = [1.5], [2.5], [2.5]
    many = [[i] for i in range(20)]
    assert any_identical([b], [a, b]) and not any_identical([c], [a, b])  # identity, not ==
    assert any_identical([*many, b], [a, b]) and not any_identical(many, [a, b, *[[0]] * 9])
    assert not any_identical([], [a]) and not any_identical([a], [])
    take = Taker([3, 0, 2])
    assert len(take) == 3
    taken = take([a, b], (c, "out"))
    assert taken[0] == "out" and taken[1] is a and taken[2] is c
    assert take([a, b], [c, "out"])[0] == "out"  # the outputs come as a list or a tuple
    with pytest.raises(IndexError, match="index 3 out of range of 2 and 1 items"):
        take([a, b], (c,))
    with pytest.raises(TypeError):
        take([a, b], "cd")
