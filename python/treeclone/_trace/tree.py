"""The flattened structure a trace works on: nodes, their key paths, and what tells two apart.

Shared by every step of a trace (``treeclone._trace.steps``) and by the transformations that
check a structure of their own (the loops' carry).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
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


def same_data(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


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


class Paths:
    """Key paths of the nodes of the (rebuilt) input tree, for error messages."""

    def __init__(self, sdef: Any, objs: list, layout: Layout):
        self.sdef, self.objs, self.layout = sdef, objs, layout
        self.info = sdef.node_info()
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
                keys = child_keys(self.objs[n], entry)
                for key, child in zip(keys, entry.children, strict=False):
                    agenda.append((child, p + keystr((key,))))

    def child(self, node: int, j: int, now: Any) -> str:
        """Path of child ``j`` of ``node``, whose value is ``now`` after the call."""
        obj = self.objs[node]
        keys = child_keys(obj, self.info[node])
        key = keystr((keys[j],)) if j < len(keys) else f"[{j}]"
        if j >= len(keys) or isinstance(keys[j], FlattenedIndexKey):
            # A node registered without keys: name the attribute that holds the value, if any.
            for name, value in getattr(obj, "__dict__", {}).items():
                if value is now:
                    key = f".{name}"
                    break
        return self.paths.get(node, "?") + key


def equal_empty_nodes(before: Any, after: Any) -> bool:
    """Whether two entries are leafless nodes of one immutable type with equal static data (nnx's
    per-module ``PytreeState``, rebuilt by every unflatten): no value a caller could rely on
    changed when one replaces the other (docs/semantics.md, rule 12)."""
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
