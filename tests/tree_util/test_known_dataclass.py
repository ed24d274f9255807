"""Nodes registered by ``jax.tree_util.register_dataclass``, whose flatten the core runs natively
(``rust/node/known.rs``), against jaxlib's: the same leaves (``is``), and at every node the
same type and an aux made of the same objects; the same error where a field cannot be read;
Python's function wherever the native one would disagree with it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import profiles
import pytest
import treeclone as treeclone_root
import treeclone.tree_util as tc
from helpers import assert_flattens_as_jax, check_same_error
from hypothesis import given, settings
from hypothesis import strategies as st
from treeclone import _jax_compat, _native


@jtu.register_dataclass
@dataclasses.dataclass
class Params:
    w: Any
    b: Any
    name: str = dataclasses.field(default="p", metadata={"static": True})


@dataclasses.dataclass
class State:
    params: Any
    step: Any
    tx: Any  # meta: a plain value
    cache: Any = dataclasses.field(default=None, init=False)  # not a field JAX reads


jtu.register_dataclass(State, data_fields=["params", "step"], meta_fields=["tx"], drop_fields=[])


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: Any
    tag: str


jtu.register_dataclass(Frozen, data_fields=["value"], meta_fields=["tag"])


class Plain:  # not a dataclass: register_dataclass takes its fields as given
    def __init__(self, a: Any, b: Any, meta: Any):
        self.a, self.b, self.meta = a, b, meta


jtu.register_dataclass(Plain, data_fields=["b", "a"], meta_fields=["meta"])


@dataclasses.dataclass
class Slotted:
    __slots__ = ("x", "y")
    x: Any
    y: Any


jtu.register_dataclass(Slotted, data_fields=["x"], meta_fields=["y"])


def trees() -> list[Any]:
    w, b = jnp.ones(2), jnp.zeros(2)
    params = Params(w, b)
    return [
        params,
        State(params, jnp.zeros((), jnp.int32), ("adam", 1e-3)),
        Frozen({"a": w, "b": [b, None]}, "frozen"),
        Plain(w, (b, 3.0), meta=frozenset({1})),
        Slotted([w], "meta"),
        {"state": State([params, Params(b, w, "q")], 0, None), "other": Frozen(None, "x")},
    ]


def test_register_dataclass_nodes_are_recognised_with_their_fields():
    assert _jax_compat.classify_type(Params)[0] == _native.TypeKind.Dataclass
    assert _jax_compat.classify_type(Params)[3] == (("w", "b"), ("name",))
    assert _jax_compat.classify_type(State)[3] == (("params", "step"), ("tx",))
    assert _jax_compat.classify_type(Plain)[3] == (("b", "a"), ("meta",))
    # treeclone's own register_dataclass registers through JAX's.
    cls = treeclone_root.tree_util.register_dataclass(
        dataclasses.dataclass(type("Made", (), {"__annotations__": {"v": Any}}))
    )
    assert _jax_compat.classify_type(cls)[0] == _native.TypeKind.Dataclass


@pytest.mark.parametrize("index", range(len(trees())))
def test_register_dataclass_nodes_flatten_as_jax(index):
    tree = trees()[index]
    assert_flattens_as_jax(tree)
    # Every traversal reads the node natively: the identity flatten, paths, the leaves.
    leaves, sdef, objects = _native.flatten_shared(tree)  # distinct leaves: one per object
    assert {id(x) for x in leaves} == {id(x) for x in jtu.tree_leaves(tree)}
    assert [p for p, _ in tc.tree_flatten_with_path(tree)[0]] == [
        p for p, _ in jtu.tree_flatten_with_path(tree)[0]
    ]
    assert sdef.unflatten(leaves) is not None


def test_a_field_that_cannot_be_read_raises_what_jax_raises():
    params = Params(jnp.ones(2), jnp.zeros(2))
    del params.b
    check_same_error(lambda: tc.tree_flatten(params), lambda: jtu.tree_flatten(params))
    slotted = Slotted.__new__(Slotted)
    slotted.x = 1.0  # y never set: reading it raises
    check_same_error(lambda: tc.tree_flatten(slotted), lambda: jtu.tree_flatten(slotted))
    # A field read through a property that raises: the property's own error.

    class Broken:
        a = property(lambda self: 1 / 0)

    jtu.register_dataclass(Broken, data_fields=["a"], meta_fields=[])
    check_same_error(lambda: tc.tree_flatten(Broken()), lambda: jtu.tree_flatten(Broken()))


def test_a_function_that_only_looks_like_register_dataclass_s_is_checked():
    """A flatten named as register_dataclass's, over fields it reads in another order: the
    first node is flattened both ways, they differ, and the Python function is used from then
    on, as JAX uses it."""

    data_fields, meta_fields = ("a",), ("b",)

    def flatten_func(x):
        return (x.b,), (x.a, *data_fields, *meta_fields)  # not what the fields say

    flatten_func.__qualname__ = "register_dataclass.<locals>.flatten_func"

    class Odd:
        def __init__(self, a: Any, b: Any):
            self.a, self.b = a, b

    jtu.register_pytree_node(Odd, flatten_func, lambda aux, kids: Odd(aux[0], kids[0]))
    assert _jax_compat.classify_type(Odd)[0] == _native.TypeKind.Dataclass
    for _ in range(2):  # the first node (checked) and the next (the check's verdict)
        odd = Odd(jnp.ones(1), jnp.zeros(1))
        assert_flattens_as_jax([odd, odd])
        assert tc.tree_leaves(odd)[0] is odd.b


def test_the_native_flatten_replaces_the_function_once_checked():
    """A function made as register_dataclass makes it, counting its calls: it runs once, on
    the first node (the check), and never again: every later node is read natively."""
    data_fields, meta_fields = ("a",), ("b",)
    calls = []

    def flatten_func(x):
        calls.append(x)
        meta = tuple(getattr(x, name) for name in meta_fields)
        return tuple(getattr(x, name) for name in data_fields), meta

    flatten_func.__qualname__ = "register_dataclass.<locals>.flatten_func"

    class Counted:
        def __init__(self, a: Any, b: Any):
            self.a, self.b = a, b

    jtu.register_pytree_node(Counted, flatten_func, lambda aux, kids: Counted(kids[0], aux[0]))
    nodes = [Counted(jnp.ones(1), i) for i in range(5)]
    for _ in range(3):
        assert_flattens_as_jax(nodes)
        _native.flatten_shared(nodes)
    calls.clear()  # assert_flattens_as_jax's JAX flatten runs the function on every node
    tc.tree_flatten(nodes)
    _native.flatten_shared(nodes)
    assert calls == []


def test_a_seed_style_step_under_alias_writes_the_dataclass_back():
    """The seed discussion's pattern on a register_dataclass node: an optimizer mutated in
    place inside the jitted step and not returned; alias writes it back as plain Python."""

    @jtu.register_dataclass
    @dataclasses.dataclass
    class Counter:
        count: Any
        scale: float = dataclasses.field(default=1.0, metadata={"static": True})

    def step(counter, x):
        counter.count = counter.count + x * counter.scale
        return x * 2

    ours, plain = Counter(jnp.zeros(())), Counter(jnp.zeros(()))
    jitted = treeclone_root.jit(step, policy="alias")
    for i in range(3):
        assert float(jitted(ours, jnp.asarray(float(i)))) == float(step(plain, float(i)))
        assert float(ours.count) == float(plain.count)


field_names = st.sampled_from(["a", "b", "c", "d", "e"])


@settings(max_examples=profiles.max_examples(40), deadline=None)
@given(
    names=st.lists(field_names, min_size=0, max_size=5, unique=True),
    split=st.integers(0, 5),
    values=st.lists(st.sampled_from([None, 1, (), "s", 2.5]), min_size=5, max_size=5),
)
def test_generated_dataclasses_flatten_as_jax(names, split, values):
    """Generated field sets, split into data and meta at every point; leaves arrays, None,
    tuples, strings and numbers, nested one inside another."""
    cls = dataclasses.make_dataclass("Gen", [(n, Any) for n in names])
    data, meta = names[: min(split, len(names))], names[min(split, len(names)) :]
    jtu.register_dataclass(cls, data_fields=data, meta_fields=meta)
    fields = dict(zip(names, values, strict=False))
    inner = cls(**fields)
    outer = cls(**{n: (inner if i == 0 else jnp.ones(i)) for i, n in enumerate(names)})
    assert_flattens_as_jax([inner, outer, jax.numpy.zeros(1)])
