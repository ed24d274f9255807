"""Bound objects of every container kind and changes made to them between ``jit_partial``
calls, for the property test of what the snapshot may trust
(``tests/jit/test_jit_partial_snapshot.py``; docs/semantics.md, "jit_partial").

A tree is generated as a spec (``specs``) and built twice (``build``): with JAX arrays for
``jit_partial``, with NumPy arrays for the plain Python program. Both builds list their
changeable nodes in the same order, so a change program (``changes``) applies to either
(``apply``). The function every call runs (``summary``) adds a counter in the root (written
back at each call) to a number that depends on every leaf in flatten order and on the aux
data every registered node's flatten gives (a ``defaultdict``'s factory, a static field, a
module-level mode), read on the tree as the function sees it: a stale child, order or aux data
shows as a different number.

The kinds: dict, ``OrderedDict``, ``defaultdict``, a registered dict and list subclass, list,
tuple, namedtuple, a ``register_dataclass`` class with a meta field, a registered class with
aux data from an attribute (``Scaled``), one whose flatten reads a child through another
object that may share a small int, ``True`` or a cached array with a watched attribute
(``Hidden``), one whose aux data is a module-level setting (``Moded``), an nnx Module and an
equinox Module.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hypothesis import strategies as st
from node_kinds import MyDict, MyList, Scaled

# Module-level settings a flatten reads (``Moded``'s aux data).
MODE = {"train": True}
# What a ``defaultdict``'s factory gives: each a number the summary adds.
FACTORIES = (lambda: 1.0, lambda: 20.0, lambda: 300.0)
Pair = collections.namedtuple("Pair", ["first", "second"])


class Holder:
    """An object no flatten registers: what it holds is out of the snapshot's sight."""

    def __init__(self, x):
        self.x = x


@jax.tree_util.register_pytree_node_class
class Hidden:
    """Its flatten reads ``a`` and, through ``h``, ``h.x``: two children that may be the same
    object (a small int, ``True``, a cached array)."""

    def __init__(self, a, x):
        self.a, self.h = a, Holder(x)

    def tree_flatten(self):
        return (self.a, self.h.x), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@jax.tree_util.register_pytree_node_class
class Moded:
    """Its aux data is a module-level setting, not its own state: ``mode`` is None on the
    caller's object (which follows ``MODE``), the setting on one rebuilt from a flatten
    (``mode_of``)."""

    def __init__(self, w, mode=None):
        self.w, self.mode = w, mode

    def tree_flatten(self):
        return (self.w,), MODE["train"]

    @classmethod
    def tree_unflatten(cls, mode, children):
        return cls(children[0], mode)


def mode_of(node: Moded) -> bool:
    return MODE["train"] if node.mode is None else node.mode


@dataclasses.dataclass
class Fields:
    """Registered by ``register_dataclass``: ``x`` data, ``scale`` meta."""

    x: Any
    scale: float


jax.tree_util.register_dataclass(Fields, data_fields=["x"], meta_fields=["scale"])


class NnxLeafy(nnx.Module):
    def __init__(self, w, scale):
        self.w = nnx.Param(w)
        self.scale = scale


class EqxLeafy(eqx.Module):
    w: Any
    scale: float = eqx.field(static=True)


DICTS = ("dict", "odict", "ddict", "mydict")
NODES = ("fields", "scaled", "moded", "eqx")
SHARED = ("int", "true", "array")

leaf = st.integers(0, 9).map(lambda i: ("leaf", i))


def _dicts(inner):
    return st.tuples(
        st.sampled_from(DICTS), st.dictionaries(st.sampled_from("edcba"), inner, max_size=3)
    )


def _nodes(inner):
    return st.one_of(
        _dicts(inner),
        st.tuples(st.sampled_from(("list", "mylist", "tuple")), st.lists(inner, max_size=3)),
        st.tuples(st.just("pair"), st.tuples(inner, inner)),
        st.tuples(st.sampled_from(NODES), inner),
        st.tuples(st.just("hidden"), st.sampled_from(SHARED)),
        st.tuples(st.just("nnx"), st.integers(0, 9)),
    )


# A tree spec: ``("leaf", i)`` or ``(kind, payload)``; the bound argument is a dict of up to
# four nodes (leaves at the top would only dilute the examples).
specs = st.lists(_nodes(st.recursive(leaf, _nodes, max_leaves=4)), min_size=1, max_size=4).map(
    lambda nodes: dict(zip("zyxw", nodes, strict=False))
)

OPS = ("leaf", "hidden", "factory", "mode", "static", "order", "add")
changes = st.lists(st.tuples(st.integers(0, 50), st.sampled_from(OPS)), max_size=4)


class Built:
    """A tree built from a spec with one array kind (``xp``: ``jnp`` or ``np``), and its
    changeable nodes in build order."""

    def __init__(self, spec, xp):
        self.xp = xp
        self.nodes: list = []
        self.cached = xp.full((2,), 7.0, dtype=np.float32)  # shared by Hidden's children
        self.tree = {"n": xp.zeros((), dtype=np.float32), "t": self.build(("dict", spec))}

    def array(self, i):
        return self.xp.full((2,), float(i), dtype=np.float32)

    def shared(self, kind, new=False):
        if kind == "int":
            return 5 if new else 1
        if kind == "true":
            return not new
        return self.array(8) if new else self.cached

    def build(self, spec):
        kind, payload = spec
        if kind == "leaf":
            return self.array(payload)
        if kind in DICTS:
            items = {k: self.build(v) for k, v in payload.items()}
            node = {
                "dict": dict,
                "odict": collections.OrderedDict,
                "ddict": lambda i: collections.defaultdict(FACTORIES[0], i),
                "mydict": MyDict,
            }[kind](items)
        elif kind in ("list", "mylist"):
            node = (list if kind == "list" else MyList)(self.build(v) for v in payload)
        elif kind == "tuple":
            return tuple(self.build(v) for v in payload)
        elif kind == "pair":
            return Pair(*(self.build(v) for v in payload))
        elif kind == "hidden":
            node = Hidden(self.shared(payload), self.shared(payload))
            node.kind = payload
        elif kind == "nnx":
            node = NnxLeafy(self.array(payload), 2.0)
        else:
            child = self.build(payload)
            node = {
                "fields": lambda: Fields(child, 2.0),
                "scaled": lambda: Scaled(child, 2.0),
                "moded": lambda: Moded(child),
                "eqx": lambda: EqxLeafy(child, 2.0),
            }[kind]()
        self.nodes.append(node)
        return node


def apply(built: Built, program, round_: int) -> None:
    """Make the changes of ``program`` to ``built``'s nodes (the same on either build)."""
    for choice, op in program:
        # Each change to every node it fits, the one ``choice`` picks first (a program finds
        # the few nodes of a kind in a generated tree that way); the global mode is flipped
        # by ``flip_mode``, once for both builds.
        nodes = built.nodes[choice % len(built.nodes) :] + built.nodes[: choice % len(built.nodes)]
        for node in nodes if op != "mode" else ():
            _change(built, node, op, built.array(10 + choice % 7 + round_), 3.0 + choice % 5)


def _change(built: Built, node, op: str, new, scale: float) -> None:
    if op == "leaf":
        if isinstance(node, dict) and node:
            node[list(node)[-1]] = new
        elif isinstance(node, list) and node:
            node[-1] = new
        elif isinstance(node, Hidden):
            node.a = built.shared(node.kind, new=True)  # a watched attribute
        elif isinstance(node, NnxLeafy):
            node.w.set_value(new)
        elif isinstance(node, Fields):
            node.x = new
        elif isinstance(node, (Scaled, Moded)):
            node.w = new
        elif isinstance(node, EqxLeafy):
            object.__setattr__(node, "w", new)
    elif op == "hidden" and isinstance(node, Hidden):
        node.h.x = built.shared(node.kind, new=True)  # out of the snapshot's sight
    elif op == "factory" and isinstance(node, collections.defaultdict):
        node.default_factory = FACTORIES[(FACTORIES.index(node.default_factory) + 1) % 3]
    elif op == "static":
        if isinstance(node, (Scaled, Fields, NnxLeafy)):
            node.scale = scale
        elif isinstance(node, EqxLeafy):
            object.__setattr__(node, "scale", scale)
    elif op == "order" and isinstance(node, dict) and node:
        first = list(node)[0]
        if isinstance(node, collections.OrderedDict):
            node.move_to_end(first)
        else:
            node[first] = node.pop(first)
    elif op == "add":
        if isinstance(node, dict):
            node["new" + str(len(node))] = new
        elif isinstance(node, list):
            node.append(new)


def flip_mode(program) -> None:
    if any(op == "mode" for _, op in program):
        MODE["train"] = not MODE["train"]


def _statics(node) -> Any:
    """What the aux data of the tree's nodes say, as the function sees them rebuilt."""
    total = 0.0
    if isinstance(node, collections.defaultdict):
        total += node.default_factory()
    if isinstance(node, Moded):
        total += 1000.0 if mode_of(node) else 0.0
    if isinstance(node, (Scaled, Fields, NnxLeafy, EqxLeafy)):
        total += node.scale
    if isinstance(node, dict):
        children = list(node.values())
    elif isinstance(node, (list, tuple)):
        children = list(node)
    elif isinstance(node, (Scaled, Moded, EqxLeafy)):
        children = [node.w]
    elif isinstance(node, Fields):
        children = [node.x]
    else:
        children = []
    return total + sum(_statics(c) for c in children)


def summary(root, x):
    """The function every call runs: a counter written back, and a number that depends on
    every leaf in flatten order and on every node's aux data."""
    root["n"] = root["n"] + x
    leaves = jax.tree.leaves(root["t"])
    weighted = sum(
        ((i + 1.0) * jnp.sum(jnp.asarray(v, jnp.float32)) for i, v in enumerate(leaves)),
        start=jnp.zeros((), jnp.float32),
    )
    return weighted + _statics(root["t"]) + root["n"]
