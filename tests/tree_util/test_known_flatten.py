"""flax nnx's flatten functions, which the core runs natively (``rust/node/known.rs``), against
JAX running flax's own: the same leaves (``is``), and at every node the same type and an aux
made of the same objects; the same error where flax's function raises; Python's function
wherever the native one does not cover a node (int keys) or would disagree with it."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import profiles
import pytest
import treeclone
import treeclone.tree_util as tc
from helpers import assert_flattens_as_jax, check_same_error
from hypothesis import given, settings
from hypothesis import strategies as st
from treeclone import _jax_compat, _native

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")
HashableMapping = pytest.importorskip("flax.typing").HashableMapping
PytreeState = pytest.importorskip("flax.nnx.pytreelib").PytreeState


class Block(nnx.Module):
    def __init__(self, din: int, dout: int, rngs: Any):
        self.linear = nnx.Linear(din, dout, rngs=rngs)
        self.bn = nnx.BatchNorm(dout, rngs=rngs)
        self.name = "block"  # static: a str
        self.scale = nnx.data(2.0)  # data: marked by nnx.data
        self.sizes = (din, dout)  # static: a tuple of ints
        self.extra = nnx.data({"a": nnx.Param(jnp.ones(2), note="x", alpha=1), "b": None})

    def __call__(self, x):
        return nnx.relu(self.bn(self.linear(x)))


def model_and_optimizer() -> tuple[Any, Any]:
    rngs = nnx.Rngs(0)
    model = nnx.Sequential(Block(3, 4, rngs), Block(4, 2, rngs))  # nnx.List: int keys
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    return model, optimizer


def test_nnx_flatten_functions_are_recognised():
    kinds = {
        t: _jax_compat.classify_type(t)[0]
        for t in (Block, nnx.Linear, nnx.Param, nnx.Optimizer, PytreeState, nnx.State)
    }
    assert kinds[nnx.State] is _native.TypeKind.NnxState
    assert kinds[Block] is _native.TypeKind.NnxPytree
    assert kinds[nnx.Linear] is _native.TypeKind.NnxPytree
    assert kinds[nnx.Optimizer] is _native.TypeKind.NnxPytree
    assert kinds[nnx.Param] is _native.TypeKind.NnxVariable
    assert kinds[PytreeState] is _native.TypeKind.NnxPytreeState


def test_a_model_and_its_optimizer_flatten_as_jax():
    model, optimizer = model_and_optimizer()
    assert_flattens_as_jax((model, optimizer))
    assert_flattens_as_jax(nnx.split((model, optimizer))[1])  # the functional form: State


def test_states_flatten_as_jax():
    """``nnx.State`` (the functional form's mappings): str keys, int keys (an nnx.List's
    layers), empty, nested; keys of both kinds raise flax's sort error, as under JAX."""
    model, optimizer = model_and_optimizer()
    graphdef, state = nnx.split(model)
    assert isinstance(state["layers"], nnx.State)  # int keys: 0, 1
    params, rest = nnx.split(model, nnx.Param, ...)[1:]
    for tree in (state, params, rest, nnx.State({}), nnx.State({"a": nnx.State({10: 1, 2: 2})})):
        assert_flattens_as_jax(tree)
    mixed = nnx.State({"a": jnp.ones(1), 0: jnp.zeros(1)})
    check_same_error(lambda: tc.tree_flatten(mixed), lambda: jtu.tree_flatten(mixed))
    # A model rebuilt from the native flatten's State is the model.
    rebuilt = nnx.merge(graphdef, tc.tree_unflatten(*reversed(tc.tree_flatten(state))))
    np.testing.assert_array_equal(
        rebuilt.layers[0].linear.kernel[...], model.layers[0].linear.kernel[...]
    )


def test_native_flatten_after_a_training_step_and_attribute_changes():
    model, optimizer = model_and_optimizer()

    def loss(model):
        return jnp.sum(model(jnp.ones((1, 3))) ** 2)

    optimizer.update(model, nnx.grad(loss)(model))
    model.layers[0].new_attr = nnx.Param(jnp.zeros(1))  # a data attribute added later
    model.layers[0].zz_static = "late"  # and a static one, sorted after the others
    del model.layers[1].name
    assert_flattens_as_jax((model, optimizer))


def test_flattens_stay_exact_as_modules_and_variables_change_between_them():
    """The native flatten keeps each Module's and Variable's aux between flattens while their
    dicts hold the same objects (``rust/node/memo.rs``): every change a later flatten must see
    is seen, in place or not."""
    model, optimizer = model_and_optimizer()
    block = model.layers[0]
    param = block.extra["a"]
    changes = [
        lambda: None,  # the memo's own result
        lambda: setattr(block, "name", "renamed"),  # a static value replaced
        lambda: setattr(block, "scale", nnx.data(3.0)),  # a child replaced
        lambda: setattr(block, "sizes", nnx.data((jnp.ones(1),))),  # static becomes data
        lambda: setattr(block, "late", "static"),  # a key added
        lambda: delattr(block, "late"),  # and removed
        lambda: param._var_metadata.__setitem__("note", "y"),  # metadata changed in place
        lambda: param._var_metadata.__setitem__("added", 1),  # metadata grown in place
        lambda: param.__setitem__(..., jnp.zeros(2)),  # the Variable's value replaced
        lambda: vars(block).update(reversed(list(vars(block).items()))),  # same items, reordered
        # which attributes are data, changed in the mapping itself (flax's mapping of the
        # class, shared by its Modules: compared by its PEP 509 version where it has one)
        lambda: block._pytree__nodes._mapping.__setitem__("name", True),
        lambda: block._pytree__nodes._mapping.__setitem__("name", False),
    ]
    for change in changes:
        change()
        assert_flattens_as_jax((model, optimizer))
        assert_flattens_as_jax(nnx.split((model, optimizer))[1])


def test_new_variables_with_the_same_metadata_share_its_memo():
    """A functional loop gets new Variables at every step, each with a new metadata dict
    holding the same objects: their flatten finds the memo those objects were first flattened
    with (the very aux object, not a new one and a new memo at every step). A dict with
    equal values that are other objects, or other keys, gets its own aux, made of its own
    objects, as under JAX."""
    note = "".join(["no", "te"])  # a str of its own, equal to others
    first = nnx.Param(jnp.ones(2), note=note, alpha=1)
    aux = tc.tree_flatten(first)[1].node_data()[1]
    for _ in range(3):
        again = nnx.Param(jnp.zeros(2), **dict(first._var_metadata))  # new dict, same objects
        assert tc.tree_flatten(again)[1].node_data()[1] is aux
        assert_flattens_as_jax(again)
    equal = nnx.Param(jnp.ones(2), note="".join(["no", "te"]), alpha=1)  # equal, not the same
    assert tc.tree_flatten(equal)[1].node_data()[1] is not aux
    assert_flattens_as_jax(equal)
    more = nnx.Param(jnp.ones(2), note=note, alpha=1, beta=2)
    assert_flattens_as_jax(more)
    # The functional form's loop: each step's new state flattens with the last one's memo
    # (from the second step: a Variable made by nnx holds its metadata in another order).
    model, optimizer = model_and_optimizer()
    state = nnx.split((model, optimizer))[1]
    step = treeclone.jit(lambda s: jtu.tree_map(lambda a: a + 1, s), policy="strict")

    def kernel_aux(state):
        return tc.tree_flatten(state[0]["layers"][0]["linear"]["kernel"])[1].node_data()[1]

    state = step(state)
    before = kernel_aux(state)
    for _ in range(2):
        state = step(state)
        assert kernel_aux(state) is before
    assert_flattens_as_jax(state)


def test_flattening_each_new_state_keeps_nothing_per_state():
    """A loop that makes a new state at every step (a functional training loop) and flattens
    it keeps no object per step: what the native flatten keeps of a Variable's metadata is
    found again by the next state's Variables. (Kept per metadata dict, each step's flatten
    kept four tuples per Variable until its memo filled: a garbage collection at almost every
    step of a 100-block model.)"""
    import gc

    model, optimizer = model_and_optimizer()
    state = nnx.split((model, optimizer))[1]
    n_variables = len(jtu.tree_leaves(state))
    for _ in range(3):  # warm up: nnx made the first Variables' metadata in another order
        state = jtu.tree_map(lambda a: a, state)  # new Variables, the same metadata objects
        tc.tree_flatten(state)
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for _ in range(5):
            state = jtu.tree_map(lambda a: a, state)
            tc.tree_flatten(state)
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert n_variables > 10
    assert grown < n_variables  # four per Variable and step when the memo missed


def test_flattened_modules_are_freed():
    """What the native flatten keeps between flattens keeps no Module, Variable or array alive."""
    import gc
    import weakref

    model, optimizer = model_and_optimizer()
    tc.tree_flatten((model, optimizer))
    tc.tree_flatten(nnx.split((model, optimizer))[1])
    # (A Variable takes no weak reference: its array stands for it.)
    refs = [weakref.ref(model), weakref.ref(model.layers[0].linear.kernel.get_raw_value())]
    del model, optimizer
    gc.collect()
    assert [r() for r in refs] == [None, None]


def _cycle_through_a_module() -> Any:
    model, _ = model_and_optimizer()
    block = model.layers[0]
    block.others = nnx.data([jnp.ones(1), block])  # a data attribute holding the block
    return model


def _cycle_through_a_variable() -> Any:
    items = [jnp.ones(1)]
    variable = nnx.Variable(items)  # its value is the very list
    items.append(variable)
    return {"v": variable}


def _cycle_through_a_state() -> Any:
    state = nnx.split(model_and_optimizer()[0])[1]
    state["layers"][0]["again"] = state
    return state


@pytest.mark.parametrize(
    "make", [_cycle_through_a_module, _cycle_through_a_variable, _cycle_through_a_state]
)
def test_the_cycle_check_finds_cycles_through_nnx_nodes(make):
    """The check before ``jax.jit``'s call under ``clone`` walks flax's nodes by their children
    alone (no sort, no aux data: ``known::children``) once their type is checked: it still
    finds every cycle through them, with the error every policy gives; a tree without one
    passes."""
    model, optimizer = model_and_optimizer()
    tc.tree_flatten((model, optimizer, nnx.split(model)[1]))  # every type checked already
    _native.check((model, optimizer, nnx.split((model, optimizer))[1]))
    cyclic = make()
    with pytest.raises(ValueError, match="cycle detected in pytree"):
        _native.check(cyclic)
    for policy in ("clone", "alias", "strict"):
        with pytest.raises(ValueError, match="cycle detected in pytree: .* at state"):
            treeclone.jit(lambda state: 0, policy=policy)(cyclic)


def test_bad_nodes_raise_what_flax_raises():
    model, _ = model_and_optimizer()
    block = model.layers[0]
    vars(block)[1] = "not a str key"  # flax's sort of vars() fails: int < str
    check_same_error(lambda: tc.tree_flatten(block), lambda: jtu.tree_flatten(block))
    param = nnx.Param(jnp.ones(2))
    param._var_metadata[0] = "int key"  # the same for a Variable's metadata
    check_same_error(lambda: tc.tree_flatten(param), lambda: jtu.tree_flatten(param))


def test_a_function_that_differs_from_the_native_one_wins(monkeypatch):
    """The first node of a type is flattened both ways: where the native version disagrees
    (here: a type said to use flax's function that does not), Python's result is used, for
    that node and every later one."""

    class Reversed:
        """Not an nnx Module, but with the attributes the native flatten reads."""

        _pytree__has_int_keys = False

        def __init__(self, a: Any = None, b: Any = None):
            self.a = nnx.Param(jnp.ones(1)) if a is None else a
            self.b = nnx.Param(jnp.zeros(1)) if b is None else b
            self._pytree__nodes = HashableMapping({"a": True, "b": True})

    def reversed_flatten(obj):
        return [obj.b, obj.a], (("b", "a"), (), ())

    def reversed_unflatten(aux, children):
        b, a = children
        return Reversed(a, b)

    jtu.register_pytree_node(Reversed, reversed_flatten, reversed_unflatten)
    real = _jax_compat._custom_kind

    def custom_kind(flatten):
        return _native.TypeKind.NnxPytree if flatten is reversed_flatten else real(flatten)

    monkeypatch.setattr(_jax_compat, "_custom_kind", custom_kind)
    _native.invalidate_registry_cache()
    try:
        assert _jax_compat.classify_type(Reversed)[0] is _native.TypeKind.NnxPytree
        for _ in range(3):
            assert_flattens_as_jax(Reversed())
    finally:
        monkeypatch.undo()
        _native.invalidate_registry_cache()


# ------------------------------------------------------------------ generated modules

NAMES = st.sampled_from(["a", "b", "c", "kernel", "bias", "Ä", "_private", "z1", "é", "x_y"])
VALUES = st.one_of(
    st.integers(-3, 3),
    st.text(max_size=3),
    st.none(),
    st.builds(lambda n: np.arange(n, dtype=np.float32), st.integers(0, 3)),
)


class Generated(nnx.Module):
    pass


def _variable(value: Any, metadata: dict[str, Any], kind: int) -> Any:
    cls = (nnx.Param, nnx.BatchStat, nnx.Variable)[kind]
    return cls(jnp.asarray(value), **metadata)


VARIABLES = st.builds(
    _variable,
    st.builds(lambda n: np.arange(n, dtype=np.float32), st.integers(0, 3)),
    st.dictionaries(st.sampled_from(["note", "alpha", "tag", "zeta"]), VALUES, max_size=3),
    st.integers(0, 2),
)


def _module(attrs: list[tuple[str, str, Any]]) -> Any:
    module = Generated()
    for name, how, value in attrs:
        if how == "data":
            value = nnx.data(value)
        elif how == "static":
            value = nnx.static(value)
        try:
            setattr(module, name, value)
        except (ValueError, TypeError):
            pass  # a value nnx refuses for this marking: not part of the tree under test
    return module


MODULES = st.recursive(
    st.builds(
        _module,
        st.lists(st.tuples(NAMES, st.sampled_from(["auto", "data", "static"]), VARIABLES)),
    ),
    lambda inner: st.builds(
        _module,
        st.lists(
            st.tuples(
                NAMES,
                st.sampled_from(["auto", "data"]),
                st.one_of(inner, VARIABLES, st.lists(inner, max_size=2), VALUES),
            ),
            max_size=4,
        ),
    ),
    max_leaves=6,
)


@settings(max_examples=profiles.max_examples(60))
@given(MODULES)
def test_generated_modules_flatten_as_jax(module):
    assert_flattens_as_jax(module)
    assert_flattens_as_jax([module, {"again": module}])


def test_variable_slots_are_read_as_getattr_reads_them_also_after_the_class_changes():
    """The native flatten and the cycle check read a Variable's ``_raw_value`` and
    ``_var_metadata`` from where the instance stores them, the place found once per version
    of the class (``SlotReader`` in ``rust/cpython/members.rs``): a property shadowing the slot, a
    ``__getattribute__`` set on the class later and an unset slot are each seen as ``getattr``
    sees them, by the flatten (against JAX's) and by the cycle check (a value that contains
    the Variable itself only through the class's ``__getattribute__``)."""

    class Tracked(nnx.Param):
        pass

    variable = Tracked(jnp.ones(2), note="n")
    other = Tracked(jnp.zeros(3))
    jitted = treeclone.jit(lambda v: 0)

    def agree() -> None:
        for v in (variable, other, [variable, other]):
            assert_flattens_as_jax(v)
        jitted(variable)  # no cycle

    agree()
    shadow = jnp.full(4, 2.0)
    Tracked._raw_value = property(lambda self: shadow, lambda self, value: None)  # hides the slot
    agree()
    assert tc.tree_leaves(variable)[0].shape == (4,)
    del Tracked._raw_value
    agree()

    loop: list = []

    def getattribute(self: Any, name: str) -> Any:
        if name == "_raw_value" and self is variable:
            return loop
        return object.__getattribute__(self, name)

    Tracked.__getattribute__ = getattribute  # type: ignore[method-assign]
    loop.append(variable)
    assert_flattens_as_jax(other)
    with pytest.raises(ValueError, match="cycle detected"):
        jitted(variable)
    del Tracked.__getattribute__
    agree()

    object.__delattr__(other, "_raw_value")  # unset: getattr goes on to __getattr__
    check_same_error(lambda: tc.tree_flatten(other), lambda: jtu.tree_flatten(other))


def _python_frames_named(name: str, call: Any) -> int:
    """How many Python frames of functions called ``name`` ``call()`` runs."""
    import sys

    seen = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == name:
            seen.append(1)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return len(seen)


@pytest.mark.parametrize("length", [2, 300])  # 300: keys past the interpreter's small ints
def test_an_nnx_list_s_int_keys_and_every_module_s_state_are_read_natively(length: int):
    """An ``nnx.List`` keys its items by number (flax's ``_maybe_int`` of each name) and every
    Module holds a ``PytreeState`` whose aux are two properties: both are read natively, with
    no Python frame of flax's flatten functions after the first node of each type, and the
    result is JAX's running flax's own."""
    layers = nnx.List([nnx.Linear(2, 2, rngs=nnx.Rngs(i)) for i in range(length)])
    layers.append(nnx.Param(jnp.ones(1)))
    assert_flattens_as_jax(layers)
    names = ("_pytree__flatten", "initializing", "is_setup")
    assert sum(_python_frames_named(n, lambda: tc.tree_flatten(layers)) for n in names) == 0
    assert sum(_python_frames_named(n, lambda: _native.flatten_shared(layers)) for n in names) == 0
