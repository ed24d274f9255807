"""The flattened structure a trace works on: nodes, their key paths, and what tells two apart.

Shared by every step of a trace (``treeclone._effects.steps``) and by the transformations that
check a structure of their own (the loops' carry).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from treeclone import _native
from treeclone._jax_compat import (
    DictKey,
    FlattenedIndexKey,
    GetAttrKey,
    SequenceKey,
    keystr,
    unflatten_node,
)
from treeclone._jax_compat import flatten_one_level_with_keys as keyed_children
from treeclone._native import EntryInfo

NodeInfo = EntryInfo.Node


class Layout:
    """How a call's arguments sit in the tree that is flattened: ``(*args, kwargs)``, the
    dynamic positional arguments named ``names``; ``positions``, the position of each among
    all the call's positional arguments (static ones included; default: 0, 1, ...)."""

    __slots__ = ("names", "num_args", "positions")

    def __init__(self, num_args: int, names: Sequence[str], positions: Sequence[int] = ()):
        self.num_args = num_args
        self.names = tuple(names)
        self.positions = tuple(positions) or tuple(range(num_args))

    def split(self, root: tuple) -> tuple[tuple, dict]:
        return root[: self.num_args], root[self.num_args]

    def arg_name(self, i: int) -> str:
        if i < self.num_args:
            return self.names[i] if i < len(self.names) else f"args[{i}]"
        return ""


def argument_tops(info: list, layout: Layout) -> list[tuple[int, int | str]]:
    """Each argument's top node in a flattened call (``info``: its ``node_info()``) and the key
    a per-argument policy dict names it by: the parameter's name, else its position (an
    ``*args`` entry); a keyword argument's name."""
    root_children = info[-1].children
    tops: list[tuple[int, int | str]] = []
    for a, top in enumerate(root_children[: layout.num_args]):
        name = layout.arg_name(a)
        tops.append((top, name if name.isidentifier() else layout.positions[a]))
    if len(root_children) > layout.num_args:  # the kwargs dict: its children are arguments
        kwargs = info[root_children[layout.num_args]]
        tops += zip(kwargs.children, kwargs.data or (), strict=False)
    return tops


def is_nan(x: Any) -> bool:
    """Whether ``x`` is a NaN scalar: a Python float's or complex's, or a NumPy one's.

    >>> from treeclone._effects import is_nan
    >>> import numpy as np
    >>> [is_nan(x) for x in (float("nan"), np.float32("nan"), complex(0, float("nan")), 1.0)]
    [True, True, True, False]
    """
    return isinstance(x, (float, complex, np.inexact)) and bool(x != x)


def same_data(a: Any, b: Any) -> bool:
    """Whether two static values (a node's static data, a static leaf, a static argument) are
    one value: the same object; else equal by ``==`` (an ``==`` that raises or whose result has
    no truth value counts as different), a NaN equal to a NaN of its type, also inside tuples,
    lists and dicts of one type (NaN-equality, as ``jax.tree_util`` compares aux data with
    ``==`` and a Python tuple compares its items by identity first).

    >>> from treeclone._effects import same_data
    >>> nan = float("nan")
    >>> same_data(nan, nan), same_data(nan, float("nan")), same_data((1, nan), (1, float("nan")))
    (True, True, True)
    >>> same_data(1, 1.0), same_data(nan, 0.0), same_data([nan], (nan,))
    (True, False, False)
    """
    if a is b:
        return True
    try:
        if bool(a == b):
            return True
    except Exception:
        return False
    return _nan_equal(a, b)


def _nan_equal(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b``, unequal by ``==``, differ only by NaNs (see :func:`same_data`)."""
    if type(a) is not type(b):
        return False
    if is_nan(a):
        return is_nan(b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_data(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_data(a[k], b[k]) for k in a)
    return False


def same_static(a: Any, b: Any) -> bool:
    """Whether two static leaves (``traced=``) or static arguments are one value: the same
    object, or of one type (``2`` and ``2.0`` are two, as ``jax.jit`` keys a static argument
    with its type) and :func:`same_data`, so a NaN is the same value as a NaN.

    >>> from treeclone._effects import same_static
    >>> same_static(float("nan"), float("nan")), same_static(2, 2.0), same_static("a", "a")
    (True, False, True)
    """
    return a is b or (type(a) is type(b) and same_data(a, b))


_NAN_HASH = hash("treeclone: NaN")

# The types of the values whose static hash may differ from ``hash``: NaN scalars (Python's,
# NumPy's) and tuples, which may hold one. A cache key of many static values checks their
# types against it (at C speed) before it hashes each with ``static_hash``.
NAN_TYPES = frozenset(
    {float, complex, tuple, np.float16, np.float32, np.float64, np.longdouble}
    | {np.complex64, np.complex128, np.clongdouble}
)


def static_key(x: Any) -> Any:
    """``x`` as a cache key compared in C keys it: a NaN as every NaN of its type (a tuple
    standing for it, which no leaf can equal: a tuple is a pytree node), a tuple by its items'
    keys, anything else as it is.

    >>> from treeclone._effects import static_key
    >>> static_key(float("nan")) == static_key(float("nan")), static_key("relu")
    (True, 'relu')
    """
    if isinstance(x, (float, complex, np.inexact)) and is_nan(x):
        return ("treeclone: NaN", type(x))
    if type(x) is tuple:
        return tuple(static_key(y) for y in x)
    return x


def static_hash(x: Any) -> int:
    """``hash(x)`` for a cache key that compares with :func:`same_static`: a NaN hashes as
    every NaN of its type (Python hashes a float NaN by its identity), and a tuple by its
    items' static hashes; a TypeError for an unhashable value, as ``hash``.

    >>> from treeclone._effects import static_hash
    >>> static_hash(float("nan")) == static_hash(float("nan")), static_hash(2) == hash(2)
    (True, True)
    """
    if isinstance(x, (float, complex, np.inexact)):
        return hash((type(x), _NAN_HASH)) if is_nan(x) else hash(x)
    if type(x) is tuple:
        return hash((tuple, *(static_hash(y) for y in x)))
    return hash(x)


def child_keys(obj: Any, entry: NodeInfo) -> list[Any]:
    """JAX's key entries for the children of a node (trace time only: used for messages)."""
    ty, arity, data = entry.node_type, entry.arity, entry.data
    if ty in (list, tuple):
        return [SequenceKey(i) for i in range(arity)]
    if ty is dict:
        return [DictKey(k) for k in data]
    if issubclass(ty, tuple) and hasattr(ty, "_fields"):
        return [GetAttrKey(f) for f in ty._fields]
    if issubclass(ty, dict):  # a registered dict subclass: its keys in child order
        try:
            return [DictKey(k) for k in unflatten_node(ty, data, [None] * arity)]
        except Exception:
            pass
    try:
        keyed, _ = keyed_children(obj)
        return [k for k, _ in keyed]
    except Exception:
        return [FlattenedIndexKey(i) for i in range(arity)]


class ChildKeys:
    """``child_keys`` of the nodes of one flattened tree (``objs``, ``info``), each node's
    made once: a message naming N children of one node costs O(N), not O(N x its width)
    (``keys(n)[j]`` per child rebuilt the node's whole key list each time)."""

    __slots__ = ("_attrs", "_keys", "_positions", "info", "objs")

    def __init__(self, objs: Sequence[Any], info: Sequence[Any]):
        self.objs, self.info = objs, info
        self._keys: dict[int, list[Any]] = {}
        self._attrs: dict[int, dict[int, str]] = {}
        self._positions: dict[int, dict[Any, int] | None] = {}

    def keys(self, n: int) -> list[Any]:
        keys = self._keys.get(n)
        if keys is None:
            keys = self._keys[n] = child_keys(self.objs[n], self.info[n])
        return keys

    def index(self, n: int, key: Any) -> int | None:
        """The position of the first child of node ``n`` whose key equals ``key``."""
        positions = self._positions.get(n)
        if positions is None:
            positions = {}
            try:
                for i, k in enumerate(self.keys(n)):
                    positions.setdefault(k, i)
            except TypeError:  # a registered node's unhashable key: look it up in order
                positions = None
            self._positions[n] = positions
        if positions is not None:
            try:
                return positions.get(key)
            except TypeError:
                pass
        return next((i for i, k in enumerate(self.keys(n)) if k == key), None)

    def attribute_of(self, n: int, value: Any) -> str | None:
        """The first attribute of node ``n``'s object that holds ``value`` (by identity)."""
        names = self._attrs.get(n)
        if names is None:
            names = self._attrs[n] = {}
            for name, held in getattr(self.objs[n], "__dict__", {}).items():
                names.setdefault(id(held), name)
        return names.get(id(value))


class Paths:
    """Key paths of the nodes of the (rebuilt) input tree, for error messages."""

    def __init__(self, sdef: Any, objs: list, layout: Layout):
        self.sdef, self.objs, self.layout = sdef, objs, layout
        self.info = sdef.node_info()
        self.keys = ChildKeys(objs, self.info)
        self.paths: dict[int, str] = {}
        for i, child in enumerate(self.info[-1].children):
            if i < layout.num_args:
                self._walk(child, layout.arg_name(i))
            else:  # the kwargs dict: its keys are the argument names
                kwargs = self.info[child]
                for key, grandchild in zip(kwargs.data or (), kwargs.children, strict=False):
                    self._walk(grandchild, str(key))

    def _walk(self, node: int, path: str) -> None:
        agenda = [(node, path)]
        while agenda:
            n, p = agenda.pop()
            if n in self.paths:
                continue
            self.paths[n] = p
            entry = self.info[n]
            if isinstance(entry, NodeInfo) and entry.arity:
                keys = self.keys.keys(n)
                for key, child in zip(keys, entry.children, strict=False):
                    agenda.append((child, p + keystr((key,))))

    def child(self, node: int, j: int, now: Any) -> str:
        """Path of child ``j`` of ``node``, whose value is ``now`` after the call."""
        keys = self.keys.keys(node)
        key = keystr((keys[j],)) if j < len(keys) else f"[{j}]"
        if j >= len(keys) or isinstance(keys[j], FlattenedIndexKey):
            # A node registered without keys: name the attribute that holds the value, if any.
            name = self.keys.attribute_of(node, now)
            if name is not None:
                key = f".{name}"
        return self.paths.get(node, "?") + key


def equal_empty_nodes(before: Any, after: Any) -> bool:
    """Whether two entries are leafless nodes of one immutable type with equal static data (nnx's
    per-module ``PytreeState``, rebuilt by every unflatten): no value a caller could rely on
    changed when one replaces the other (docs/semantics.md, rule J14)."""
    return (
        isinstance(before, NodeInfo)
        and isinstance(after, NodeInfo)
        and before.node_type is after.node_type
        and not issubclass(before.node_type, (list, dict))
        and before.arity == 0 == after.arity
        and same_data(before.data, after.data)
    )


def unstable_static_data(root: Any, info: list) -> set[int]:
    """Nodes whose flatten makes its static data afresh each time (an aux object equal only to
    itself, as ``jax.jit`` allows): a change of their static data cannot be told apart."""
    probe = _native.flatten_shared(root)[1].node_info()
    return {
        k
        for k, (a, b) in enumerate(zip(info, probe, strict=False))
        if isinstance(a, NodeInfo) and isinstance(b, NodeInfo) and not same_data(a.data, b.data)
    }


def holds_tracer(data: Any) -> bool:
    """Whether a node's static data holds a traced value (it would leak into the caller)."""
    if isinstance(data, Tracer):
        return True
    try:
        return any(isinstance(x, Tracer) for x in jax.tree_util.tree_leaves(data))
    except Exception:
        return False
