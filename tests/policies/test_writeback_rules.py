"""The write-back rules of docs/semantics.md ("What write-back changes"), one test per rule.

Each runs jitted and eagerly (``treeclone.call``); ``alias`` is checked against the same
function run on the caller's objects without any transformation (plain Python).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from node_kinds import Model, MyDict, MyList, Noted, Scaled

MODES = ["jit", "call"]


def runner(mode, fun, policy):
    if mode == "jit":
        return tc.jit(fun, policy=policy)
    return lambda *a, **k: tc.call(fun, *a, policy=policy, **k)


def as_lists(tree):
    return jax.tree.map(lambda x: np.asarray(x).tolist(), tree)


def add_two_keys(d):
    d["z"] = jnp.ones(2)
    d["y"] = jnp.zeros(2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "make",
    [
        collections.OrderedDict,
        lambda items: collections.defaultdict(list, items),
        MyDict,
    ],
    ids=["OrderedDict", "defaultdict", "dict-subclass"],
)
def test_alias_writes_dict_subclass_items_in_place(mode, make):
    items = {"b": np.zeros(2), "a": np.ones(2)}
    expected = make(copy.deepcopy(items))
    add_two_keys(expected)
    caller = make(items)
    holder = [caller]
    runner(mode, lambda h: add_two_keys(h[0]), "alias")(holder)
    assert holder[0] is caller  # updated in place, not replaced
    assert type(caller) is type(expected)
    assert list(caller) == list(expected)  # plain Python's order: kept keys, then new ones
    assert as_lists(dict(caller)) == as_lists(dict(expected))


@pytest.mark.parametrize("mode", MODES)
def test_alias_returns_the_callers_ordereddict_with_its_new_keys(mode):
    def f(d):
        d["x"] = jnp.ones(1)
        return d

    caller = collections.OrderedDict(b=np.zeros(1))
    out = runner(mode, f, "alias")(caller)
    assert out is caller and list(caller) == ["b", "x"]


@pytest.mark.parametrize("mode", MODES)
def test_alias_writes_list_subclass_items_in_place(mode):
    caller = MyList([np.zeros(1)])

    def f(xs):
        xs.append(jnp.ones(1))

    runner(mode, f, "alias")(caller)
    assert type(caller) is MyList and as_lists(list(caller)) == [[0.0], [1.0]]


@pytest.mark.parametrize("mode", MODES)
def test_alias_keeps_state_outside_the_pytree(mode):
    model = Model(np.ones(2))
    model.history.append("epoch 1")
    noted = Noted(np.ones(1), "the caller's note")

    def step(m, n):
        m.w = m.w * 2
        n.x = n.x + 1

    runner(mode, step, "alias")(model, noted)
    assert model.history == ["epoch 1"]  # not reset to the [] its unflatten builds
    assert noted.note == "the caller's note"  # a drop_fields field is not written
    assert as_lists(model.w) == [2.0, 2.0] and as_lists(noted.x) == [2.0]


@pytest.mark.parametrize("mode", MODES)
def test_alias_keeps_mutations_of_detached_containers(mode):
    def detach(d):
        inner = d["l"]
        inner.append(jnp.ones(1))
        d["l"] = [jnp.zeros(1)]

    caller = {"l": [np.full(1, 5.0)]}
    inner = caller["l"]
    expected = copy.deepcopy(caller)
    expected_inner = expected["l"]
    detach(expected)
    runner(mode, detach, "alias")(caller)
    assert as_lists(caller) == as_lists(expected)
    assert as_lists(inner) == as_lists(expected_inner)  # the append stays, as in plain Python
    assert caller["l"] is not inner


@pytest.mark.parametrize("mode", MODES)
def test_strict_reports_mutations_of_detached_containers(mode):
    def detach(d):
        inner = d["l"]
        inner.append(jnp.ones(1))
        d["l"] = [jnp.zeros(1)]
        return d

    with pytest.raises(tc.MutationError, match="list resized"):
        runner(mode, detach, "strict")({"l": [np.zeros(1)]})


class Broken:
    def __init__(self, a, b):
        self.a, self.b = a, b


jax.tree_util.register_pytree_node(Broken, lambda o: ((o.a, o.b), None), lambda _, c: Broken(*c))


def test_register_inplace_hook_that_raises_leaves_its_object_unchanged():
    def update(target, source):
        target.a = source.a  # half the update, then a failure
        if float(np.asarray(source.b)[0]) > 0:
            raise RuntimeError("hook failed")
        target.b = source.b

    tc.register_inplace(Broken, update)
    obj = Broken(np.zeros(1), np.zeros(1))
    other = [np.zeros(1)]

    def f(o, xs):
        o.a = o.a + 1
        o.b = o.b + 1
        xs.append(jnp.ones(1))

    with pytest.raises(RuntimeError, match="hook failed"):
        tc.call(f, obj, other, policy="alias")
    assert as_lists(obj.a) == [0.0] and as_lists(obj.b) == [0.0]
    assert len(other) == 1  # all or nothing: the list write is undone too


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_traced_value_in_static_data_is_an_error_naming_the_argument(mode, policy):
    layer = Scaled(jnp.ones(2), 1.0)

    def f(layer):
        layer.scale = layer.w.sum()
        return layer

    if mode == "call":  # eagerly the value is concrete: it is static data like any other
        out = runner(mode, f, policy)(layer)
        assert float(out.scale) == 2.0
        return
    with pytest.raises(ValueError, match=r"traced value in the static data of layer"):
        runner(mode, f, policy)(layer)
    assert layer.scale == 1.0


@pytest.mark.parametrize("mode", MODES)
def test_attribute_set_outside_the_pytree_is_an_error_under_alias(mode):
    model = Model(np.ones(1))

    def f(m):
        m.cache = m.w * 2

    with pytest.raises(ValueError, match=r"set the attribute 'cache' on m"):
        runner(mode, f, "alias")(model)
    assert not hasattr(model, "cache")


@pytest.mark.parametrize("mode", MODES)
def test_strict_flags_an_attribute_set_outside_the_pytree(mode):
    def f(m):
        m.cache = m.w * 2
        return 0

    with pytest.raises(tc.MutationError, match=r"m: attribute 'cache' set outside the pytree"):
        runner(mode, f, "strict")(Model(np.ones(1)))


@pytest.mark.parametrize("mode", MODES)
def test_strict_names_a_key_added_to_an_ordereddict(mode):
    def f(d):
        d["new"] = jnp.ones(1)
        return 0

    with pytest.raises(tc.MutationError, match=r"d: key added: 'new'"):
        runner(mode, f, "strict")(collections.OrderedDict(a=np.zeros(1)))


class Meta:
    """Static data equal only to itself."""


@jax.tree_util.register_pytree_node_class
class FreshAux:
    def __init__(self, w):
        self.w = w

    def tree_flatten(self):
        return (self.w,), Meta()  # a new aux object at every flatten

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@pytest.mark.parametrize("mode", MODES)
def test_strict_accepts_a_pure_function_whose_aux_data_is_fresh_each_flatten(mode):
    out = runner(mode, lambda n: n.w * 2, "strict")(FreshAux(np.ones(1)))
    assert as_lists(out) == [2.0]

    # and a real change to it is still reported
    def f(n):
        n.w = n.w + 1
        return 0

    with pytest.raises(tc.MutationError, match=r"n\.w: replaced"):
        runner(mode, f, "strict")(FreshAux(np.ones(1)))


# --- NumPy arrays under treeclone.call (mutable leaves) ----------------------------------------


def bump(p):
    p["w"] += 1


def test_call_clone_never_changes_the_callers_numpy_arrays():
    x = np.zeros(2)
    tc.call(bump, {"w": x})
    assert x.tolist() == [0.0, 0.0]


def test_call_alias_writes_numpy_changes_once_the_call_succeeds():
    x = np.zeros(2)
    tc.call(bump, {"w": x}, policy="alias")
    assert x.tolist() == [1.0, 1.0]  # as plain Python

    def then_fail(p):
        bump(p)
        raise RuntimeError("after the mutation")

    with pytest.raises(RuntimeError):
        tc.call(then_fail, {"w": x}, policy="alias")
    assert x.tolist() == [1.0, 1.0]  # all or nothing: the failed call changed nothing

    def returns(a):
        a += 1
        return a

    assert tc.call(returns, x, policy="alias") is x and x.tolist() == [2.0, 2.0]


def test_call_strict_reports_a_numpy_array_changed_and_not_returned():
    x = np.zeros(2)
    with pytest.raises(tc.MutationError, match=r"p\['w'\]: array changed in place"):
        tc.call(bump, {"w": x}, policy="strict")
    assert x.tolist() == [0.0, 0.0]

    def returns(p):
        bump(p)
        return p

    out = tc.call(returns, {"w": x}, policy="strict")
    assert out["w"].tolist() == [1.0, 1.0] and x.tolist() == [0.0, 0.0]


@dataclasses.dataclass
class Config:
    lr: float
    name: str = "cfg"


jax.tree_util.register_static(Config)


@pytest.mark.parametrize("mode", MODES)
def test_strict_reports_a_static_object_changed_in_place_and_restores_it(mode):
    cfg = Config(0.1)

    def f(x, cfg):
        cfg.lr = 0.5
        return x * 2

    with pytest.raises(tc.MutationError, match=r"cfg: static object changed in place"):
        runner(mode, f, "strict")(jnp.ones(1), cfg)
    assert cfg.lr == 0.1  # strict never changes the caller's objects


@dataclasses.dataclass(eq=False)
class Schedule:
    """Plain data held by a static object (a dataclass: strict looks inside it)."""

    steps: dict


class Settings:
    """A static object holding plain data below its top level, and a nested static object."""

    def __init__(self):
        self.layers = [1, 2]
        self.schedule = Schedule({"warmup": [10]})
        self.tags = {"a"}
        self.inner = Settings.Inner()

    class Inner:
        def __init__(self):
            self.depth = 1


jax.tree_util.register_static(Settings)
jax.tree_util.register_static(Settings.Inner)

DEEP_CHANGES = {
    "cfg.layers": lambda cfg: cfg.layers.append(3),
    "cfg.schedule.steps['warmup']": lambda cfg: cfg.schedule.steps["warmup"].append(20),
    "cfg.tags": lambda cfg: cfg.tags.add("b"),
    "cfg.inner": lambda cfg: setattr(cfg.inner, "depth", 2),
}


def settings_state(cfg):
    """What a Settings holds, by value, and the identity of each object inside it."""
    values = (
        list(cfg.layers),
        {k: list(v) for k, v in cfg.schedule.steps.items()},
        set(cfg.tags),
        cfg.inner.depth,
    )
    objects = (cfg.layers, cfg.schedule, cfg.schedule.steps, cfg.tags, cfg.inner)
    return values, [id(o) for o in objects]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", list(DEEP_CHANGES))
def test_strict_reports_a_change_below_a_static_objects_top_level_and_restores_it(mode, where):
    # docs/semantics.md, rule J29: strict watches the plain data inside a static object.
    cfg = Settings()
    before = settings_state(cfg)

    def f(x, cfg):
        DEEP_CHANGES[where](cfg)
        return x * 2

    pattern = re.escape(f"{where}: changed in place, inside the static object cfg")
    with pytest.raises(tc.MutationError, match=pattern):
        runner(mode, f, "strict")(jnp.ones(1), cfg)
    assert settings_state(cfg) == before  # put back: strict never changes the caller's objects


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", list(DEEP_CHANGES))
def test_alias_keeps_a_change_below_a_static_objects_top_level_as_plain_python(mode, where):
    # docs/semantics.md, rule J29: under alias a static object is the caller's own, as in plain
    # Python (inside jit, the change is made when the function is traced).
    def f(x, cfg):
        DEEP_CHANGES[where](cfg)
        return x * 2

    plain = Settings()
    want = f(np.ones(1), plain)
    cfg = Settings()
    ids = settings_state(cfg)[1]
    got = runner(mode, f, "alias")(jnp.ones(1), cfg)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert settings_state(cfg)[0] == settings_state(plain)[0] and settings_state(cfg)[1] == ids


class Activations:
    """A static object holding jitted functions, whose caches fill when they are called."""

    def __init__(self):
        self.ours = tc.jit(lambda x: x * 3, policy="alias")
        self.jaxs = jax.jit(lambda x: x + 1)


jax.tree_util.register_static(Activations)


@pytest.mark.parametrize("mode", MODES)
def test_strict_compares_other_objects_inside_a_static_object_by_identity(mode):
    # docs/semantics.md, rule J29: a jitted function inside a static object is not looked
    # into (its cache fills at the first call), so calling it is no change.
    acts = Activations()
    held = (acts.ours, acts.jaxs)

    def f(x, acts):
        return acts.jaxs(acts.ours(x))

    got = runner(mode, f, "strict")(jnp.ones(2), acts)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(jnp.ones(2), Activations())))
    assert (acts.ours, acts.jaxs) == held


SHARED_STATE = {"w": np.zeros(1)}


def test_an_argument_also_changed_through_a_global_is_an_error_not_a_silent_clobber():
    def f(d):
        SHARED_STATE["extra"] = 1.0  # the caller's object, through the global
        d["x"] = np.ones(1)  # the same object, through the argument

    with pytest.raises(ValueError, match=r"changed d through another name"):
        tc.call(f, SHARED_STATE, policy="alias")
    assert list(SHARED_STATE) == ["w"]  # put back as it was


def test_jit_reports_an_argument_also_changed_through_a_global():
    def f(d):
        SHARED_STATE["extra"] = d["w"] * 2  # a tracer would leak into the caller's dict
        d["x"] = jnp.ones(1)

    with pytest.raises(ValueError, match=r"changed d through another name"):
        tc.jit(f, policy="alias")(SHARED_STATE)
    assert list(SHARED_STATE) == ["w"]


class Holder:
    """A registered class whose unflatten stores each child in an attribute as it is; counts
    its unflattens."""

    unflattens = 0

    def __init__(self, w, b):
        self.w, self.b = w, b


def _unflatten_holder(_, children):
    Holder.unflattens += 1
    return Holder(*children)


jax.tree_util.register_pytree_node(Holder, lambda h: ((h.w, h.b), None), _unflatten_holder)


class Wrapped:
    def __init__(self, value):
        self.value = value


class Converting:
    """A registered class whose unflatten wraps its child: the attribute is not the child."""

    def __init__(self, w):
        self.w = w if isinstance(w, Wrapped) else Wrapped(w)


jax.tree_util.register_pytree_node(
    Converting, lambda c: ((c.w.value,), None), lambda _, children: Converting(children[0])
)


@pytest.mark.parametrize("mode", MODES)
def test_alias_sets_attributes_that_hold_children_directly(mode):
    holder = Holder(jnp.zeros(2), jnp.ones(2))
    b = holder.b

    def f(h):
        h.w = h.w + 1

    run = runner(mode, f, "alias")
    run(holder)  # traced (jit) or run (call) once: the node's unflatten builds what it checks
    before = Holder.unflattens
    for _ in range(3):
        run(holder)
    assert as_lists(holder.w) == [4.0, 4.0]
    assert holder.b is b  # not written: unchanged
    if mode == "jit":  # at each call the attribute is set without rebuilding the node
        assert Holder.unflattens == before


class Guarded(Holder):
    """A Holder whose own ``__setattr__`` refuses every assignment (as a frozen dataclass's
    does): write-back sets attributes as ``object.__setattr__`` does, past it."""

    def __init__(self, w, b):
        object.__setattr__(self, "w", w)
        object.__setattr__(self, "b", b)

    def __setattr__(self, name, value):
        raise AttributeError(f"{name} is read-only")


jax.tree_util.register_pytree_node(
    Guarded, lambda h: ((h.w, h.b), None), lambda _, children: Guarded(*children)
)


@pytest.mark.parametrize("mode", MODES)
def test_alias_sets_attributes_past_a_class_own_setattr(mode):
    guarded = Guarded(jnp.zeros(2), jnp.ones(2))

    def f(h):
        object.__setattr__(h, "w", h.w + 1)

    run = runner(mode, f, "alias")
    for _ in range(3):
        run(guarded)
    assert as_lists(guarded.w) == [3.0, 3.0] and as_lists(guarded.b) == [1.0, 1.0]
    with pytest.raises(AttributeError, match="read-only"):
        guarded.w = None


class SlottedHolder:
    """A Holder whose attributes are slots, as an nnx Variable's value is: write-back stores
    them where the instance keeps them, as ``object.__setattr__`` would."""

    __slots__ = ("w", "b")

    def __init__(self, w, b):
        self.w, self.b = w, b


jax.tree_util.register_pytree_node(
    SlottedHolder, lambda h: ((h.w, h.b), None), lambda _, children: SlottedHolder(*children)
)


@pytest.mark.parametrize("mode", MODES)
def test_alias_sets_slots_as_object_setattr_does_also_after_the_class_changes(mode):
    """The place of a slot is remembered per version of the class: once the class is changed
    (here its slot hidden behind a property), the write goes through what
    ``object.__setattr__`` finds now. A place kept by the class alone would skip the setter."""

    class Slots:
        __slots__ = ("w", "b")

        def __init__(self, w, b):
            self.w, self.b = w, b

    jax.tree_util.register_pytree_node(
        Slots, lambda h: ((h.w, h.b), None), lambda _, children: Slots(*children)
    )
    obj = Slots(jnp.zeros(2), jnp.ones(2))
    b = obj.b

    def f(h):
        h.w = h.w + 1

    run = runner(mode, f, "alias")
    run(obj)
    run(obj)
    assert as_lists(obj.w) == [2.0, 2.0] and obj.b is b
    slot, seen = Slots.w, []

    def set_w(h, value):
        if h is obj:  # not the copies ``call`` runs the function on
            seen.append(value)
        slot.__set__(h, value)

    Slots.w = property(slot.__get__, set_w)
    run(obj)
    assert len(seen) == 1 and seen[0] is obj.w and as_lists(obj.w) == [3.0, 3.0]
    assert obj.b is b


@pytest.mark.parametrize("mode", MODES)
def test_alias_writes_inside_a_kept_subtree_that_a_later_reference_returns(mode):
    """A model the caller keeps (its nodes are its own objects after the call) with leaves
    written in place deep inside it, reached twice (a ``Ref``), and returned through the
    second place: the write-back hands over the caller's objects, writes exactly the slot
    changed, and returns the caller's model, as plain Python does, at every call."""

    def f(state):
        inner = state["model"].w
        inner.w = inner.w + 1
        return state["again"], state["model"].b

    def make(array):
        model = Holder(
            SlottedHolder(array([1.0]), array([2.0])), SlottedHolder(array([3.0]), array([4.0]))
        )
        return {"model": model, "again": model}

    state, plain = make(jnp.asarray), make(np.asarray)
    model, first, second = state["model"], state["model"].w, state["model"].b
    kept = (first.b, second.w, second.b)
    run = runner(mode, f, "alias")
    for calls in range(1, 4):
        out, b = run(state)
        expected_out, expected_b = f(plain)
        assert out is model and b is second and state["again"] is model
        assert model.w is first and model.b is second and first.b is kept[0]
        assert (second.w, second.b) == kept[1:]  # not written: the very objects
        assert as_lists(first.w) == as_lists(plain["model"].w.w) == [1.0 + calls]
        assert expected_out is plain["model"] and expected_b is plain["model"].b


@pytest.mark.parametrize("mode", MODES)
def test_alias_rebuilds_a_node_whose_unflatten_converts_its_children(mode):
    obj = Converting(jnp.zeros(2))

    def f(c):
        c.w = Wrapped(c.w.value + 1)

    runner(mode, f, "alias")(obj)
    runner(mode, f, "alias")(obj)
    assert isinstance(obj.w, Wrapped) and as_lists(obj.w.value) == [2.0, 2.0]
    expected = Converting(np.zeros(2))
    f(expected)
    f(expected)
    assert as_lists(obj.w.value) == as_lists(expected.w.value)


@pytest.mark.parametrize("kind", [Holder, SlottedHolder])
@pytest.mark.parametrize("mode", MODES)
def test_alias_undoes_attributes_set_directly_when_a_later_write_fails(mode, kind):
    """An attribute set directly (in the instance dict, or in a slot where the object keeps
    it) is put back when a later write fails; twice, so that the second call finds a slot's
    place known."""

    def update(target, source):
        raise RuntimeError("hook failed")

    tc.register_inplace(Broken, update)
    holder = kind(np.zeros(1), np.zeros(1))
    w = holder.w
    broken = Broken(np.zeros(1), np.zeros(1))

    def f(h, o):
        h.w = h.w + 1
        o.a = o.a + 1

    for _ in range(2):
        with pytest.raises(RuntimeError, match="hook failed"):
            runner(mode, f, "alias")(holder, broken)
        assert as_lists(holder.w) == [0.0] and as_lists(broken.a) == [0.0]
        assert holder.w is w


@pytest.mark.parametrize("mode", MODES)
def test_alias_hands_back_untouched_subtrees_with_their_sharing(mode):
    """The write-back skips a subtree the trace proved unchanged (rule J21) and hands the
    caller's own objects over, also where a later place refers back into it (a shared
    container), at every call of the same structure, with other objects each time."""

    def step(t):
        t["live"].append(t["frozen"]["inner"]["w"] * 2)
        return t["again"], t["frozen"]

    def state():
        shared = {"w": jnp.ones(2), "v": [jnp.zeros(1)]}
        return {"frozen": {"inner": shared, "other": (jnp.ones(3),)}, "again": shared, "live": []}

    f = runner(mode, step, "alias")
    for _ in range(3):  # the plan traced by the first call serves the others
        t, plain = state(), state()
        frozen, inner, other = t["frozen"], t["frozen"]["inner"], t["frozen"]["other"]
        again, frozen_out = f(t)
        step(plain)
        assert again is inner and t["again"] is inner and frozen_out is frozen
        assert t["frozen"] is frozen and t["frozen"]["other"] is other
        assert as_lists(t) == as_lists(plain)

    def write_through_the_reference(t):
        t["again"]["w"] = t["again"]["w"] + 1

    t = state()
    runner(mode, write_through_the_reference, "alias")(t)
    assert t["frozen"]["inner"] is t["again"]
    assert as_lists(t["frozen"]["inner"]["w"]) == [2.0, 2.0]


# Rule J20, entry by entry: a write-back sets the keys, indices and attributes the function
# changed and nothing else, so what another thread writes meanwhile into the same containers
# is never reverted to the value read at call start.


@jax.tree_util.register_pytree_node_class
class Pair:
    def __init__(self, acc, ext):
        self.acc, self.ext = acc, ext

    def tree_flatten(self):
        return (self.acc, self.ext), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)


# How each container kind is made, read and written: ``acc`` is what the function updates,
# ``ext`` what the other thread writes.
KINDS = {
    "dict": (
        lambda: {"acc": jnp.zeros(()), "ext": 0},
        lambda s: s["ext"],
        lambda s, i: s.__setitem__("ext", i),
    ),
    "list": (lambda: [jnp.zeros(()), 0], lambda s: s[1], lambda s, i: s.__setitem__(1, i)),
    "node": (lambda: Pair(jnp.zeros(()), 0), lambda s: s.ext, lambda s, i: setattr(s, "ext", i)),
    "ordereddict": (
        lambda: collections.OrderedDict(acc=jnp.zeros(()), ext=0),
        lambda s: s["ext"],
        lambda s, i: s.__setitem__("ext", i),
    ),
}


def _accumulate(s, x):
    if isinstance(s, Pair):
        s.acc = s.acc + x
    elif isinstance(s, list):
        s[0] = s[0] + x
    else:
        s["acc"] = s["acc"] + x


def run_against_a_writer(kind, steps, caller):
    """Run ``steps`` calls of ``_accumulate`` on one state (through ``caller``: "partial" or
    "jit") while a thread writes 1, 2, 3, ... into its ``ext`` entry; returns the values of
    ``ext`` read after each step, the thread's last write, the final value and ``acc``."""
    import sys
    import threading

    make, read, write = KINDS[kind]
    state = make()
    stop, last = threading.Event(), [0]

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            write(state, i)
            last[0] = i

    step = (
        tc.jit_partial(_accumulate, state)
        if caller == "partial"
        else functools.partial(tc.jit(_accumulate, policy="alias"), state)
    )
    step(1.0)  # traced before the thread starts
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=writer)
    thread.start()
    seen = []
    try:
        for _ in range(steps):
            step(1.0)
            seen.append(read(state))
    finally:
        stop.set()
        thread.join(timeout=60)
        sys.setswitchinterval(interval)
    acc = state.acc if kind == "node" else state["acc"] if kind != "list" else state[0]
    return seen, last[0], read(state), float(acc)


@pytest.mark.parametrize("caller", ["partial", "jit"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_writer_threads_entries_are_never_reverted_by_a_write_back(kind, caller):
    steps = 3000
    seen, last, final, acc = run_against_a_writer(kind, steps, caller)
    assert acc == steps + 1  # every step's own update is written
    assert all(a <= b for a, b in itertools.pairwise(seen)), "ext went backwards"
    assert final == last


# --- Rule J22: a registered node's attribute-held dict or list is updated in place ----------


class DictHeld:
    """A registered node whose flatten reads its children from a dict attribute, and whose
    unflatten builds a new object (and a new dict)."""

    def __init__(self, d: dict):
        self.d = d


class ListHeld:
    """The same with a list attribute."""

    def __init__(self, items: list):
        self.items = items


jax.tree_util.register_pytree_node(
    DictHeld,
    lambda p: (list(p.d.values()), tuple(p.d)),
    lambda keys, children: DictHeld(dict(zip(keys, children, strict=True))),
)
jax.tree_util.register_pytree_node(
    ListHeld, lambda p: (list(p.items), len(p.items)), lambda n, children: ListHeld(list(children))
)


def _set_entry(p):
    p.d["w"] = p.d["w"] + 1


def _add_and_delete(p):
    p.d["c"] = p.d["w"] * 2
    del p.d["b"]


def _replace_dict(p):
    p.d = {"w": p.d["w"] - 1, "b": p.d["b"]}


def _set_item(p):
    p.items[1] = p.items[1] * 3


def _append(p):
    p.items.append(p.items[0] + 5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "make,fun",
    [
        (lambda: DictHeld({"w": np.zeros(2), "b": np.ones(())}), _set_entry),
        (lambda: DictHeld({"w": np.zeros(2), "b": np.ones(())}), _add_and_delete),
        (lambda: DictHeld({"w": np.zeros(2), "b": np.ones(())}), _replace_dict),
        (lambda: ListHeld([np.zeros(2), np.ones(2)]), _set_item),
        (lambda: ListHeld([np.zeros(2), np.ones(2)]), _append),
    ],
    ids=["set", "add-delete", "replace", "list-set", "list-append"],
)
def test_alias_updates_an_attribute_held_container_in_place_as_plain_python(mode, make, fun):
    name = "d" if isinstance(make(), DictHeld) else "items"
    # Plain Python on NumPy copies: what the caller's object and a held reference end with.
    plain = make()
    plain_ref = getattr(plain, name)
    fun(plain)
    # alias on the same objects (as jax arrays).
    obj = jax.tree.map(jnp.asarray, make())
    ref = getattr(obj, name)
    runner(mode, fun, "alias")(obj)
    assert (getattr(obj, name) is ref) == (getattr(plain, name) is plain_ref)
    for got, want in ((getattr(obj, name), getattr(plain, name)), (ref, plain_ref)):
        assert type(got) is type(want)
        if isinstance(want, dict):
            assert list(got) == list(want)
            got, want = list(got.values()), list(want.values())
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
