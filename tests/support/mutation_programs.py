"""Random container trees of every kind JAX knows, and random mutation programs over them,
with what plain Python and treeclone must agree on (``describe``). Shared by the alias
property tests (``tests/policies/test_alias_container_kinds.py``) and jit_partial's
(``tests/jit/test_jit_partial.py``)."""

from __future__ import annotations

import collections
import copy

import jax
import numpy as np
from hypothesis import strategies as st
from node_kinds import Model, ModelCopy, MyDict, MyList, Noted, Stored

DICTS = (dict, collections.OrderedDict, MyDict, "defaultdict")
LISTS = (list, MyList)


def make_dict(kind, items):
    if kind == "defaultdict":
        return collections.defaultdict(list, items)
    return kind(items)


leaf = st.integers(0, 9).map(lambda i: np.full((2,), float(i), dtype=np.float32))
keys = st.sampled_from(["e", "b", "d", "a", "c"])


def _mutable(inner):
    return st.one_of(
        st.tuples(st.sampled_from(LISTS), st.lists(inner, max_size=3)).map(lambda p: p[0](p[1])),
        st.tuples(st.sampled_from(DICTS), st.dictionaries(keys, inner, max_size=3)).map(
            lambda p: make_dict(p[0], p[1])
        ),
    )


def _extend(inner):
    return st.one_of(_mutable(inner), st.tuples(inner, inner), inner.map(Noted), inner.map(Model))


# The root is a mutable container (the argument the program mutates).
trees = _mutable(st.recursive(leaf, _extend, max_leaves=8))


def _extend_bound(inner):
    return st.one_of(_extend(inner), inner.map(Stored))


# ``trees`` with ``Stored`` nodes too (jit_partial's between-call changes).
bound_trees = _mutable(st.recursive(leaf, _extend_bound, max_leaves=8))

OPS = ["set", "add", "delete", "append", "pop", "detach", "reattach"]
programs = st.lists(st.tuples(st.integers(0, 50), st.sampled_from(OPS), keys), max_size=5)
# Changes made to the caller's objects between calls only (not by a traced function): a dict
# reordered in place (``move_to_end`` on an OrderedDict), a ``__dict__`` replaced, a
# ``__class__`` reassigned (``Model`` <-> ``ModelCopy``).
BETWEEN_OPS = [*OPS, "reorder", "redict", "reclass"]
between_programs = st.lists(
    st.tuples(st.integers(0, 50), st.sampled_from(BETWEEN_OPS), keys), max_size=5
)


def children(node):
    if isinstance(node, dict):
        return list(node.values())
    if isinstance(node, (list, tuple)):
        return list(node)
    if isinstance(node, Noted):
        return [node.x]
    if isinstance(node, Model):
        return [node.w]
    if isinstance(node, Stored):
        return [node._store["w"]]
    return []


def containers(tree):
    """Every mutable container reachable from ``tree``, in a fixed (breadth-first) order."""
    out, seen, agenda = [], set(), [tree]
    while agenda:
        node = agenda.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, (dict, list, Noted, Model, Stored)):
            out.append(node)
        agenda.extend(children(node))
    return out


def fresh_like(node):
    if isinstance(node, dict):
        return (
            make_dict("defaultdict", {})
            if isinstance(node, collections.defaultdict)
            else type(node)()
        )
    return type(node)()


def run_program(tree, program):
    """Apply ``program`` to ``tree`` in place, the same way on any equal copy."""
    for choice, op, key in program:
        found = containers(tree)
        node = found[choice % len(found)]
        leaves = jax.tree.leaves(tree)
        value = (leaves[0] if leaves else np.zeros(2, np.float32)) + 1
        if op == "reclass":
            if isinstance(node, Model):
                node.__class__ = Model if type(node) is ModelCopy else ModelCopy
        elif op == "redict" and isinstance(node, (Noted, Model)):
            field = "x" if isinstance(node, Noted) else "w"
            node.__dict__ = {**vars(node), field: value}
        elif op == "reorder" and isinstance(node, dict):
            if node:
                first = list(node)[choice % len(node)]
                if isinstance(node, collections.OrderedDict):
                    node.move_to_end(first)
                else:
                    node[first] = node.pop(first)
        elif op in ("reorder", "redict", "reclass"):
            continue
        elif isinstance(node, Noted):
            node.x = value
        elif isinstance(node, Model):
            node.w = value
        elif isinstance(node, Stored):
            node._store["w"] = value
        elif op in ("detach", "reattach"):
            slots = list(node) if isinstance(node, dict) else list(range(len(node)))
            if not slots:
                continue
            slot = slots[choice % len(slots)]
            child = node[slot]
            if not isinstance(child, (dict, list)):
                continue
            if op == "detach":  # mutate the child, then put a fresh container in its place
                if isinstance(child, dict):
                    child["z"] = value
                else:
                    child.append(value)
                node[slot] = fresh_like(child)
            elif node is not tree:  # move the child to the root
                del node[slot]
                if isinstance(tree, dict):
                    tree[key] = child
                else:
                    tree.append(child)
        elif isinstance(node, dict):
            present = list(node)
            if op in ("set", "append") and present:
                node[present[choice % len(present)]] = value
            elif op in ("add", "pop") and key not in node:
                node[key] = value
            elif op == "delete" and key in node:
                del node[key]
        else:
            if op == "set" and node:
                node[choice % len(node)] = value
            elif op in ("append", "add"):
                node.append(value)
            elif op in ("pop", "delete") and node:
                node.pop()


def _sorted_view(node):
    """Whether the function sees ``node``'s keys sorted (as under jax.jit): a dict or a
    defaultdict. Other dict kinds are seen in their own order."""
    return type(node) in (dict, collections.defaultdict)


def _reorder(d, keys):
    items = [(k, d[k]) for k in keys]
    d.clear()
    d.update(items)


def sorted_view(tree):
    """A deep copy of ``tree`` as a function sees it under alias: dicts and defaultdicts with
    their keys sorted (rule J9)."""
    view = copy.deepcopy(tree)
    for node in containers(view):
        if _sorted_view(node):
            _reorder(node, sorted(node))
    return view


def run_as_alias(tree, program):
    """What a call under alias does to ``tree`` (in place) when its function runs ``program``,
    written as plain Python (docs/semantics.md, rule J8): the function sees every dict and
    defaultdict with its keys sorted; afterwards each of those dicts keeps the keys the
    function kept in their own places, followed by its new keys in the order the function
    left them, and a dict the function created comes back sorted, as jax.jit builds it."""
    before = [n for n in containers(tree) if _sorted_view(n)]
    caller_order = [list(d) for d in before]
    for d in before:
        _reorder(d, sorted(d))
    run_program(tree, program)
    for d, order in zip(before, caller_order, strict=True):
        kept = [k for k in order if k in d]
        _reorder(d, kept + [k for k in d if k not in set(order)])
    known = {id(d) for d in before}
    for node in containers(tree):
        if _sorted_view(node) and id(node) not in known:
            _reorder(node, sorted(node))


def describe(node, index):
    """What plain Python and alias must agree on for one container: its type, keys in order,
    attributes outside the pytree, leaf values, and which original container (by position in
    ``index``) sits in each child place."""
    state = {"type": type(node)}
    if isinstance(node, dict):
        state["keys"] = list(node)
        if isinstance(node, collections.defaultdict):
            state["factory"] = node.default_factory
    if isinstance(node, Noted):
        state["note"] = node.note
    if isinstance(node, Model):
        state["history"] = list(node.history)
    state["children"] = [
        ("container", index.get(id(c), "new"), type(c))
        if isinstance(c, (dict, list, tuple, Noted, Model, Stored))
        else np.asarray(c).tolist()
        for c in children(node)
    ]
    return state
