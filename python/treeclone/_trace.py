"""Running a function on rebuilt inputs and working out what it did to them.

Used at trace time by ``treeclone.jit`` (the leaves are tracers) and eagerly by
``treeclone.call`` (the leaves are the caller's values). The result is a native ``CallPlan``
that rebuilds the outputs (and, under ``alias``, writes the inputs' new contents back into the
caller's objects) at every call, plus the leaves the computation must output.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import threading
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
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
    registry,
    unflatten_node,
)
from treeclone._jax_compat import flatten_one_level_with_keys as _keyed_children
from treeclone._native import EntryInfo, Origin, Source
from treeclone._writeback import changed_attributes, has_updater, writable, write_custom
from treeclone.policies import MutationError, MutationWarning, Policy, discarded_mode

NoneType = type(None)
NodeInfo = EntryInfo.Node


class Layout:
    """How a call's arguments sit in the tree that is flattened: ``(*args, kwargs)``."""

    __slots__ = ("names", "num_args")

    def __init__(self, num_args: int, names: Sequence[str]):
        self.num_args = num_args
        self.names = tuple(names)

    def split(self, root: tuple) -> tuple[tuple, dict]:
        return root[: self.num_args], root[self.num_args]

    def arg_name(self, i: int) -> str:
        if i < self.num_args:
            return self.names[i] if i < len(self.names) else f"args[{i}]"
        return ""


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
        keyed, _ = _keyed_children(obj)
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


def _describe(
    pre: NodeInfo,
    post: NodeInfo,
    objs: list,
    post_objs: list,
    entries: tuple[list, list],
    keys: tuple | None = None,
    static_comparable: bool = True,
):
    """What changed in one container: ``(child index or None, description, child now)``s.

    ``entries``: all entries before and after (a child replaced by an equal leafless node is
    no change); ``keys``: a dict's (or dict subclass's) keys before and after, in child order;
    ``static_comparable``: whether a change of the static data can be told (see
    ``unstable_static_data``)."""
    ty, old, new = pre.node_type, pre.children, post.children
    old_arity, old_data, new_arity, new_data = pre.arity, pre.data, post.arity, post.data
    changes: list[tuple[int | None, str, Any]] = []
    if keys is not None and len(keys[0]) == old_arity and len(keys[1]) == new_arity:
        old_data, new_data = keys
        new_pos = {k: i for i, k in enumerate(new_data)}
        old_keys = set(old_data)  # once: a set per key made this quadratic in the width
        added = [k for k in new_data if k not in old_keys]
        removed = [k for k in old_data if k not in new_pos]
        if added:
            changes.append((None, f"key added: {', '.join(map(repr, added))}", None))
        if removed:
            changes.append((None, f"key removed: {', '.join(map(repr, removed))}", None))
        kept = [k for k in old_data if k in new_pos]
        if not added and not removed and list(new_data) != kept:
            changes.append((None, "keys reordered", None))
        for j, k in enumerate(old_data):
            if k in new_pos and objs[old[j]] is not post_objs[new[new_pos[k]]]:
                changes.append((j, "replaced", post_objs[new[new_pos[k]]]))
        return changes
    if ty is list and old_arity != new_arity:
        changes.append((None, f"list resized from {old_arity} to {new_arity}", None))
    elif static_comparable and not same_data(old_data, new_data):
        changes.append((None, "attribute set (the node's static data changed)", None))
    if not changes:
        pre_entries, post_entries = entries
        for j, (o, n) in enumerate(zip(old, new, strict=False)):
            if objs[o] is not post_objs[n] and not equal_empty_nodes(
                pre_entries[o], post_entries[n]
            ):
                changes.append((j, "replaced", post_objs[n]))
        if old_arity != new_arity:
            changes.append((None, f"children changed from {old_arity} to {new_arity}", None))
    return changes


_running = threading.local()  # .stack: per call of run now running here, its rebuilt objects


@contextlib.contextmanager
def running_on(objs: Sequence[Any]) -> Iterator[None]:
    """While the block runs, ``objs`` (containers rebuilt for a function) are
    :func:`made_for_a_call`: a treeclone transformation writes them back itself."""
    stack = _running.__dict__.setdefault("stack", [])
    stack.append({id(o) for o in objs})
    try:
        yield
    finally:
        stack.pop()


def made_for_a_call(obj: Any) -> bool:
    """Whether ``obj`` is a container ``run`` rebuilt for a function running now in this
    thread (its ids are those of live objects: ``run`` holds them)."""
    return any(id(obj) in ids for ids in getattr(_running, "stack", ()))


def run(
    fun: Callable[..., Any],
    pre_def: Any,
    in_leaves: list,
    layout: Layout,
    policy: Policy,
    rebuild_args: Callable[[tuple, dict], tuple[tuple, dict]],
    keep_inputs: Sequence[bool] | None = None,
    transform_out: Callable[[Any], Any] | None = None,
    caller_objects: Sequence[Any] | None = None,
    track_inputs: bool = False,
    result_hook: Callable[[Any, list, list, list], Sequence[bool] | None] | None = None,
    parts: dict[str, Any] | None = None,
    arg_policies: Sequence[Policy] | None = None,
) -> tuple[Any, list, tuple[tuple[int, ...], tuple[int, ...]] | bool | None]:
    """Call ``fun`` on the tree of ``pre_def`` rebuilt from ``in_leaves``.

    Returns ``(plan, output_leaves, next_inputs)``: ``plan.apply(caller_leaves,
    caller_objects, output_leaves)`` gives the call's result (and performs the write-back under
    ``alias``); ``next_inputs`` says where the arguments' leaves are after it
    (see ``_next_inputs``; always None unless ``track_inputs``).
    ``keep_inputs[s]`` false means input slot ``s`` may not be handed back as it came in
    (it was donated): it is output by the computation instead.
    ``rebuild_args`` turns the rebuilt ``(args, kwargs)`` into the function's full arguments
    (putting static arguments back in place); ``transform_out`` is applied to the result.
    ``caller_objects``, the caller's object at each node of ``pre_def``, are watched while the
    function runs: one it changes through another name (a global that is also an argument)
    is put back and reported, since write-back would silently replace that change.
    ``result_hook(result_def, result_objects, origins, result_leaves)``, when given, sees the
    result's structure before the plan is made (``treeclone.vmap`` works out each result leaf's
    batch axis from it); it may return, per result leaf, whether an input leaf there must
    still be output by the computation (True), as a donated one is.
    ``parts``, when given, receives what the plan is made of (``def``, ``leaves`` per slot of
    it, ``origins`` per node, ``result_child``), for a caller that joins several traces'
    plans into one (``treeclone.cond``).
    ``arg_policies``, when given, is the policy of each argument (the positional ones, then the
    keyword ones in the kwargs dict's order) of a call that mixes them; ``policy`` is then the
    call's as a whole (``policies._combined``): each container follows its argument's.
    """
    root, objs = pre_def.unflatten_nodes(in_leaves)
    pre_info = pre_def.node_info()
    # node -> its argument's policy, for a call mixing them (None: ``policy`` for all).
    node_policy = None
    if arg_policies is not None:
        node_policy = _node_policies(fun, pre_def, pre_info, objs, layout, arg_policies)

    def policy_of(k: int) -> Policy:
        return policy if node_policy is None else node_policy.get(k, policy)

    unstable = unstable_static_data(root, pre_info)
    own_attributes = {
        k: set(vars(o))
        for k, (o, e) in enumerate(zip(objs, pre_info, strict=True))
        if isinstance(e, NodeInfo) and e.node_type not in (list, dict) and hasattr(o, "__dict__")
    }
    # Static objects (``register_static``: the node's aux data is the object itself) are the
    # caller's own objects inside the function too; under strict what it does to them, and to
    # the plain data they hold, is checked directly (``_static_snapshot``).
    statics = {}
    if policy.mutations == "error" or node_policy is not None:
        statics = {
            k: _static_snapshot(o)
            for k, (o, e) in enumerate(zip(objs, pre_info, strict=True))
            if isinstance(e, NodeInfo)
            and e.arity == 0
            and e.data is o
            and policy_of(k).mutations == "error"
        }
    watched = {} if caller_objects is None else watch_callers(caller_objects, objs, pre_info)
    args, kwargs = rebuild_args(*layout.split(root))
    with running_on(objs):
        out = fun(*args, **kwargs)
    if transform_out is not None:
        out = transform_out(out)
    if watched:
        check_callers(fun, caller_objects, watched, pre_def, objs, layout)
    changed_statics = {k: _static_changes(snap) for k, snap in statics.items()}
    changed_statics = {k: found for k, found in changed_statics.items() if found}
    if changed_statics:
        for found in changed_statics.values():
            for _, obj, state in found:
                _restore_static_state(obj, state)
        _raise_static_mutation(fun, changed_statics, pre_def, objs, layout)

    container_index = {
        id(o): k
        for k, (o, e) in enumerate(zip(objs, pre_info, strict=True))
        if isinstance(e, NodeInfo) and e.node_type is not NoneType
    }
    post_leaves, post_def, post_objs = _flatten_after(root, out, objs, container_index)
    post_info = post_def.node_info()
    slot_of = {id(leaf): s for s, leaf in enumerate(in_leaves)}

    # Which input containers changed, and which the function returns.
    returned = _returned_nodes(post_info, post_objs, container_index)
    mutated: list[tuple[int, list]] = []
    origin_of: dict[int, Origin] = {}
    origin_node: dict[int, int] = {}  # result node -> input node, for the origins made below
    for n, entry in enumerate(post_info):
        if not isinstance(entry, NodeInfo) or entry.node_type is NoneType:
            continue
        k = container_index.get(id(post_objs[n]))
        if k is None:
            continue
        obj, ty = post_objs[n], entry.node_type
        attrs, keys, outside = None, (pre_info[k].data, entry.data) if ty is dict else None, []
        direct = None
        # Rule 17: a list's or dict's items are written entry by entry, those the function
        # changed only; ``old_keys``: a dict's keys at call start, in child order.
        by_entry, old_keys = ty in (list, dict), pre_info[k].data if ty is dict else None
        if ty not in (list, dict) and writable(obj) and not has_updater(obj):
            if holds_tracer(entry.data):
                _raise_traced_static_data(fun, k, pre_def, objs, layout)
            attrs, keys, after = _custom_changes(pre_info[k], entry, objs, post_objs)
            by_entry, old_keys = _entrywise(pre_info[k], objs)
            direct = _direct_writes(attrs, after, [post_objs[c] for c in entry.children])
            outside = [
                name
                for name in getattr(obj, "__dict__", ())
                if name not in own_attributes.get(k, ()) and not hasattr(after, name)
            ]
        key_order = tuple(obj) if isinstance(obj, dict) else None
        # The function saw a dict's (and a defaultdict's) keys sorted, as under jax.jit, not
        # in the caller's order: the keys it kept keep their place in the caller's dict
        # (rule 7). Other dict kinds are seen in their own order, which it may change.
        sorted_view = ty is dict or ty is defaultdict
        # Bound once: each read of ``children`` builds a new list (a per-child read made this
        # loop quadratic in the node's width).
        old = pre_info[k].children
        origin_of[n] = Origin(
            node=k,
            old_children=old,
            same_data=same_data(pre_info[k].data, entry.data),
            writable=ty in (list, dict) or writable(obj),
            key_order=key_order,
            reordered=key_order is not None
            and not sorted_view
            and _reordered(keys and keys[0], key_order),
            attrs=attrs,
            direct=direct,
            by_entry=by_entry,
            old_keys=None if old_keys is None else tuple(old_keys),
        )
        origin_node[n] = k
        for j, c in enumerate(entry.children):
            # A leafless node replaced by an equal one (nnx's PytreeState, rebuilt by every
            # unflatten; rule 12) stands for the caller's own: its parent stays unchanged.
            if (
                j < len(old)
                and c not in origin_of
                and id(post_objs[c]) not in container_index
                and equal_empty_nodes(pre_info[old[j]], post_info[c])
            ):
                origin_of[c] = Origin(node=old[j], old_children=[], same_data=True, writable=False)
                origin_node[c] = k
        changes = _describe(
            pre_info[k], entry, objs, post_objs, (pre_info, post_info), keys, k not in unstable
        )
        for name in outside:
            if policy_of(k).mutations == "propagate":
                raise_outside_attribute(fun, k, name, pre_def, objs, layout)
            changes.append((None, f"attribute {name!r} set outside the pytree", None))
        if changes:
            mutated.append((k, changes))

    if node_policy is None:
        if policy.mutations == "error":
            bad = [(k, c) for k, c in mutated if k not in returned]
            if bad:
                _raise_mutation_error(fun, bad, pre_def, objs, layout)
        elif policy.mutations == "discard" and not report_off(None):
            lost = [(k, c) for k, c in mutated if k not in returned]
            if lost:
                lines = _mutation_lines(lost, pre_def, objs, layout)
                report_discarded(fun, lines, None, repr(policy))
    else:
        # Each argument's own rule: strict's are checked, clone's discarded (and reported),
        # and only alias's containers keep an origin, the caller's object written into.
        bad = [
            (k, c) for k, c in mutated if k not in returned and policy_of(k).mutations == "error"
        ]
        if bad:
            _raise_mutation_error(fun, bad, pre_def, objs, layout)
        lost = [
            (k, c) for k, c in mutated if k not in returned and policy_of(k).mutations == "discard"
        ]
        if lost and not report_off(None):
            lines = _mutation_lines(lost, pre_def, objs, layout)
            report_discarded(fun, lines, None, "'clone' (chosen for these arguments)")
        for n in [n for n, k in origin_node.items() if policy_of(k).mutations != "propagate"]:
            del origin_of[n]  # fresh containers, as under their own policy

    # The results: under "propagate" the whole (inputs, outputs) pair, written back into the
    # caller's containers; else only the outputs, as fresh containers.
    if policy.mutations == "propagate":
        result_leaves, result_def, result_objs = post_leaves, post_def, post_objs
        origins = [origin_of.get(n) for n in range(len(post_info))]
        result_child = 1
    else:
        result_leaves, result_def, result_objs = _native.flatten_shared(out)
        origins = [None] * result_def.num_nodes
        result_child = None
    forced = None
    if result_hook is not None:
        forced = result_hook(result_def, result_objs, origins, result_leaves)
    sources, outputs = [], []
    # For each result leaf, its index in ``in_leaves + outputs`` (for next_inputs below).
    pool_index: dict[int, int] = {}
    for r, leaf in enumerate(result_leaves):
        s = slot_of.get(id(leaf))
        if (
            s is not None
            and in_leaves[s] is leaf
            and (keep_inputs is None or keep_inputs[s])
            and (forced is None or not forced[r])
        ):
            sources.append(Source.Input(slot=s))
            pool_index.setdefault(id(leaf), s)
        else:
            sources.append(Source.Output(index=len(outputs)))
            pool_index.setdefault(id(leaf), len(in_leaves) + len(outputs))
            outputs.append(leaf)
    plan = _native.CallPlan(result_def, sources, origins, result_child, write_custom, pre_def)
    if parts is not None:
        parts.update(def_=result_def, leaves=result_leaves, origins=origins)
        parts["result_child"] = result_child
    if not track_inputs:
        return plan, outputs, None
    if node_policy is not None and any(policy_of(k).mutations != "propagate" for k, _ in mutated):
        # What the function did to an argument left alone is in ``root`` but not in the
        # caller's objects: jit_partial flattens its bound arguments again.
        return plan, outputs, False
    written = sorted(k for k, _ in mutated)
    before = (pre_def, pre_info, objs)
    return plan, outputs, _next_inputs(policy, root, before, in_leaves, pool_index, written)


def _node_policies(
    fun: Callable[..., Any],
    pre_def: Any,
    info: list,
    objs: list,
    layout: Layout,
    arg_policies: Sequence[Policy],
) -> dict[int, Policy]:
    """The policy of each container of the arguments: its argument's. A container reachable
    from two arguments with different policies has no single answer (written back for one,
    left alone for the other): a ValueError naming both key paths."""
    root_children = info[-1].children
    tops = list(root_children[: layout.num_args])
    if len(root_children) > layout.num_args:  # the kwargs dict: its children are arguments
        tops += info[root_children[layout.num_args]].children
    found: dict[int, Policy] = {}
    owner: dict[int, int] = {}
    refs: list[tuple[int, int]] = []  # (Ref entry, argument whose tree holds it)
    for a, (top, chosen) in enumerate(zip(tops, arg_policies, strict=True)):
        size = info[top].size if isinstance(info[top], NodeInfo) else 1
        for n in range(top - size + 1, top + 1):
            entry = info[n]
            if isinstance(entry, NodeInfo):
                found[n], owner[n] = chosen, a
            elif isinstance(entry, EntryInfo.Ref):
                refs.append((n, a))
    for n, a in refs:  # a container met again: in its first place's tree, or another's
        target = info[n].target
        first = owner.get(target)
        if first is not None and arg_policies[first] != arg_policies[a]:
            paths = Paths(pre_def, objs, layout).paths
            name = getattr(fun, "__qualname__", None) or repr(fun)
            raise ValueError(
                f"{name}: the {type(objs[target]).__name__} at {paths.get(target, '?')} "
                f"(policy {_policy_name(arg_policies[first])}) is also at "
                f"{paths.get(n, '?')} (policy {_policy_name(arg_policies[a])}): one container "
                "cannot be both written back and left alone. Pass it through one argument, "
                "or give both arguments one policy."
            )
    return found


def _policy_name(policy: Policy) -> str:
    return repr(policy.name) if policy.name is not None else repr(policy)


def _flatten_after(root: Any, out: Any, objs: list, container_index: dict[int, int]) -> tuple:
    """``flatten_shared((inputs, result))`` after the call. Input containers the function
    detached from the tree (``l = d["l"]; l.append(x); d["l"] = []``) keep what was done to
    them, as in plain Python: they are flattened after the results, so their changes are
    written back (and are unreturned ones under strict)."""
    flat = _native.flatten_shared((root, out))
    reached = {id(o) for o in flat[2]}
    detached = tuple(objs[k] for k in container_index.values() if id(objs[k]) not in reached)
    if detached:
        flat = _native.flatten_shared((root, out, detached))
    return flat


def _returned_nodes(post_info: list, post_objs: list, container_index: dict[int, int]) -> set[int]:
    """The input containers (their nodes in the input tree) that the result holds, directly
    or inside a returned input, in a flatten of ``(inputs, result, ...)``."""
    inputs_node, out_node = post_info[-1].children[:2]
    returned: set[int] = set()
    agenda = list(range(inputs_node + 1, out_node + 1))
    expanded: set[int] = set()
    while agenda:
        n = agenda.pop()
        entry = post_info[n]
        if isinstance(entry, EntryInfo.Ref):
            target = entry.target
            if target not in expanded:  # a returned input: everything under it is returned
                expanded.add(target)
                agenda.extend(range(target - post_info[target].size + 1, target + 1))
        elif isinstance(entry, NodeInfo):
            k = container_index.get(id(post_objs[n]))
            if k is not None:
                returned.add(k)
    return returned


def run_reporting_discards(
    fun: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    names: dict[int, str],
    static: frozenset[str] = frozenset(),
) -> tuple[Any, list[str]]:
    """``fun(*args, **kwargs)`` on containers made for this call (by ``jax.jit``, ``jax.grad``,
    ``treeclone.call`` under ``clone``), and a line ``path: what`` for each of those containers
    it changed in place and does not return: changes the caller never sees (``clone``
    discards them). ``names`` names the positional arguments that are traced, by position;
    keyword arguments are named by their keys. The other positions and the keywords in
    ``static`` are static arguments, not looked into.

    The same analysis as ``run``'s for ``strict``, on the containers themselves (nothing is
    rebuilt); static objects (rule 24) stay the caller's own, as in plain Python."""
    traced = [i for i in range(len(args)) if i in names]
    root = (*(args[i] for i in traced), {k: v for k, v in kwargs.items() if k not in static})
    layout = Layout(len(traced), [names[i] for i in traced])
    _, pre_def, objs = _native.flatten_shared(root)
    pre_info = pre_def.node_info()
    unstable = unstable_static_data(root, pre_info)
    container_index = {
        id(o): k
        for k, (o, e) in enumerate(zip(objs, pre_info, strict=True))
        if isinstance(e, NodeInfo) and e.node_type is not NoneType
    }
    own_attributes = {
        k: set(vars(objs[k]))
        for k in container_index.values()
        if pre_info[k].node_type not in (list, dict) and hasattr(objs[k], "__dict__")
    }
    out = fun(*args, **kwargs)
    try:
        _, post_def, post_objs = _flatten_after(root, out, objs, container_index)
    except Exception:  # noqa: BLE001 - the report never fails a call that JAX accepts
        # An input container that cannot be flattened any more: the function consumed it
        # (equinox's ``State`` once ``set`` refuses to be flattened again). Under clone it is
        # the call's own copy, the caller's is untouched: nothing to report. A result that
        # cannot be flattened is JAX's own error, raised when JAX flattens it.
        return out, []
    post_info = post_def.node_info()
    returned = _returned_nodes(post_info, post_objs, container_index)
    lost = []
    for n, entry in enumerate(post_info):
        if not isinstance(entry, NodeInfo) or entry.node_type is NoneType:
            continue
        k = container_index.get(id(post_objs[n]))
        if k is None or k in returned:
            continue
        keys = (pre_info[k].data, entry.data) if entry.node_type is dict else None
        changes = _describe(
            pre_info[k], entry, objs, post_objs, (pre_info, post_info), keys, k not in unstable
        )
        changes += [
            (None, f"attribute {name!r} set outside the pytree", None)
            for name in getattr(post_objs[n], "__dict__", ())
            if k in own_attributes and name not in own_attributes[k]
        ]
        if changes:
            lost.append((k, changes))
    return out, _mutation_lines(lost, pre_def, objs, layout) if lost else []


class ReportingDiscards:
    """``fun`` for a JAX transformation under ``clone``: each time it is traced, what it changes
    in place and does not return is reported (``policies.report_discarded``: a
    ``MutationWarning`` by default, ``mode`` for this function). To JAX it looks like ``fun``:
    its name, and ``__wrapped__``, which jax unwraps for the source and the signature. ``fun``
    is held weakly where it can be (its owner holds it), so that a cache of these keyed by
    ``fun`` (:func:`reporting_discards`) does not keep it alive.
    ``name(i)`` names positional argument ``i``; ``static_nums``/``static_names`` are the
    static arguments, not looked into."""

    def __init__(
        self,
        fun: Callable[..., Any],
        name: Callable[[int], str],
        static_nums: frozenset[int] = frozenset(),
        static_names: frozenset[str] = frozenset(),
        mode: str | None = None,
    ):
        try:
            self._fun: Callable[[], Any] = weakref.ref(fun)
        except TypeError:
            self._fun = lambda: fun
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(fun, attribute):
                setattr(self, attribute, getattr(fun, attribute))
        self._name, self._mode = name, mode
        self._static_nums, self._static_names = static_nums, static_names

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return self._fun()

    def __repr__(self) -> str:  # jax's messages name the function by its repr
        return repr(self._fun())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fun = self._fun()
        if report_off(self._mode):
            return fun(*args, **kwargs)
        n = len(args)
        static = {i + n if i < 0 else i for i in self._static_nums}
        names = {i: self._name(i) for i in range(n) if i not in static}
        out, lines = run_reporting_discards(fun, args, kwargs, names, self._static_names)
        report_discarded(fun, lines, self._mode)
        return out


_reporting: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reporting_discards(
    fun: Any,
    name: Callable[[Any], Callable[[int], str]],
    static_nums: frozenset[int] = frozenset(),
    static_names: frozenset[str] = frozenset(),
    mode: str | None = None,
) -> Any:
    """The :class:`ReportingDiscards` of ``fun`` (with these static arguments and ``mode``):
    the same object for the same ``fun``, so that JAX's caches, keyed by the function, find
    it again (two ``treeclone.jit`` of one function share a trace as two ``jax.jit`` do; a
    ``cond`` branch or loop body passed at each call is traced once). ``fun`` itself when it
    is not callable (JAX's own error follows). ``name(fun)`` gives the namer of its
    arguments."""
    if not callable(fun):
        return fun
    key = (static_nums, static_names, mode)
    try:
        per_fun = _reporting.get(fun)
        if per_fun is None:
            per_fun = _reporting[fun] = {}
    except TypeError:  # not weakly referable, or unhashable: one for this call
        per_fun = {}
    found = per_fun.get(key)
    if found is None:
        found = per_fun[key] = ReportingDiscards(fun, name(fun), *key)
    return found


def _next_inputs(
    policy: Policy,
    root: Any,
    before: tuple[Any, list, list],
    in_leaves: list,
    pool_index: dict[int, int],
    written: list[int],
) -> tuple[tuple[int, ...], tuple[int, ...]] | bool | None:
    """What the caller's arguments hold after a call, for ``jit_partial``'s cached leaves:
    None when their leaves are the ones they had; False when their structure changed or a
    container was replaced by another (they must be flattened again: the caller then holds
    objects the kept ones are not); else, for each leaf slot, its index in
    ``in_leaves + outputs``, and the caller's containers the write-back changes (``written``,
    node indices). ``before``: the structure, its node info and the rebuilt objects the
    function was given."""
    if policy.mutations != "propagate":
        return None  # nothing is written back
    pre_def, pre_info, objs = before
    after_leaves, after_def, after_objs = _native.flatten_shared(root)
    if after_def != pre_def:
        return False
    after_info = None
    for i, entry in enumerate(pre_info):
        if isinstance(entry, NodeInfo) and after_objs[i] is not objs[i]:
            # Replaced by an equal leafless node (nnx's PytreeState): the caller keeps its own.
            after_info = after_def.node_info() if after_info is None else after_info
            if not equal_empty_nodes(entry, after_info[i]):
                return False
    index = tuple(pool_index[id(leaf)] for leaf in after_leaves)
    if index == tuple(range(len(in_leaves))):
        return None
    return index, tuple(written)


def _custom_changes(
    pre: NodeInfo, post: NodeInfo, objs: list, post_objs: list
) -> tuple[tuple[str, ...] | None, tuple[list, list] | None, Any]:
    """What the function changed in a custom node through its pytree, as ``(attributes, keys,
    rebuilt)``: the node rebuilt from the caller's contents against ``rebuilt``, the node
    rebuilt from the function's (see ``_writeback.changed_attributes``); for a dict subclass,
    ``keys`` holds its keys before and after, in child order. Nones when it cannot be
    rebuilt."""
    ty = post.node_type
    try:
        before = unflatten_node(ty, pre.data, [objs[c] for c in pre.children])
        after = unflatten_node(ty, post.data, [post_objs[c] for c in post.children])
    except Exception:
        return None, None, None
    keys = (list(before), list(after)) if isinstance(before, dict) else None
    return changed_attributes(before, after), keys, after


def _entrywise(pre: NodeInfo, objs: list) -> tuple[bool, tuple | None]:
    """Whether a dict or list subclass node can be written entry by entry (rule 17): rebuilt
    from the caller's contents by its unflatten, its item ``j`` is its child ``j`` itself (a
    dict's keys then name the children in order, returned). False for any other node, or
    one whose unflatten converts or reorders its children."""
    if not issubclass(pre.node_type, (dict, list)):
        return False, None
    children = [objs[c] for c in pre.children]
    try:
        rebuilt = unflatten_node(pre.node_type, pre.data, children)
    except Exception:
        return False, None
    if isinstance(rebuilt, dict):
        items, keys = list(rebuilt.values()), tuple(rebuilt)
    elif isinstance(rebuilt, list):
        items, keys = list(rebuilt), None
    else:
        return False, None
    if len(items) != len(children) or any(a is not b for a, b in zip(items, children, strict=True)):
        return False, None
    return True, keys


def _direct_writes(
    attrs: tuple[str, ...] | None, after: Any, children: list
) -> list[tuple[str, int]] | None:
    """``(attribute, child index)`` for each changed attribute of a rebuilt custom node that
    holds one of the node's ``children`` itself: write-back then sets those attributes to the
    new children directly, without rebuilding the node (``CallPlan``'s fast path). None when
    some changed attribute holds anything else (derived or converted by the node's unflatten),
    or the node is a dict or list subclass, whose items are written as a dict's or a list's."""
    if attrs is None or isinstance(after, (dict, list)):
        return None
    position = {}
    for j, child in enumerate(children):
        position.setdefault(id(child), j)
    direct = []
    missing = object()
    for name in attrs:
        value = getattr(after, name, missing)
        j = position.get(id(value))
        if j is None or children[j] is not value:
            return None
        direct.append((name, j))
    return direct


class Same:
    """Compares by identity (a snapshot's values must be the very same objects)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and self.value is other.value

    __hash__ = None  # type: ignore[assignment]


def shallow_state(obj: Any) -> tuple:
    """What a static object holds one level down (attributes, items), by identity."""
    attrs = {n: Same(v) for n, v in getattr(obj, "__dict__", {}).items()}
    items: Any = None
    if isinstance(obj, dict):
        items = [(k, Same(v)) for k, v in obj.items()]
    elif isinstance(obj, list):
        items = [Same(v) for v in obj]
    return attrs, items


def _restore_shallow_state(obj: Any, state: tuple) -> None:
    attrs, items = state
    if hasattr(obj, "__dict__"):
        for name in [n for n in vars(obj) if n not in attrs]:
            object.__delattr__(obj, name)
        for name, value in attrs.items():
            object.__setattr__(obj, name, value.value)
    if isinstance(obj, dict):
        obj.clear()
        obj.update((k, v.value) for k, v in items)
    elif isinstance(obj, list):
        obj[:] = [v.value for v in items]


# How many objects strict watches from one static object (docs/semantics.md, rule 24).
STATIC_WATCH_LIMIT = 10_000


class _Members:
    """A set's members, compared by identity whatever their order."""

    __slots__ = ("ids", "values")

    def __init__(self, values: set):
        self.values = list(values)
        self.ids = frozenset(map(id, self.values))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Members) and self.ids == other.ids

    __hash__ = None  # type: ignore[assignment]


def _static_state(obj: Any) -> Any:
    """A watched object's state one level down, by identity (``shallow_state``; a set's
    members, a bytearray's bytes), with its attributes."""
    if isinstance(obj, set):
        return _Members(obj), shallow_state(obj)
    if isinstance(obj, bytearray):
        return bytes(obj), shallow_state(obj)
    return shallow_state(obj)


def _restore_static_state(obj: Any, state: Any) -> None:
    if isinstance(obj, (set, bytearray)):
        contents, state = state
        if isinstance(obj, set):
            obj.clear()
            obj.update(contents.values)
        else:
            obj[:] = contents
    _restore_shallow_state(obj, state)


def _is_static_object(obj: Any) -> bool:
    """Whether ``obj`` is a ``register_static`` object: a node with no children whose aux data
    is the object itself."""
    if type(obj) not in registry:
        return False
    try:
        children, aux = _keyed_children(obj)
    except Exception:  # noqa: BLE001 - not one to watch
        return False
    return not children and aux is obj


def _watched_inside(obj: Any) -> bool:
    """Whether strict looks inside ``obj``, reached from a static object: the containers of
    plain data (lists, dicts, sets, tuples, bytearrays and their subclasses), dataclass
    instances and other static objects. Anything else (an array, a function, a module, an
    object of another class) is compared by identity only: its insides may be a cache that
    legitimately changes (a jitted function's)."""
    if isinstance(obj, (list, dict, set, tuple, bytearray)):
        return True
    if isinstance(obj, type):
        return False
    return dataclasses.is_dataclass(obj) or _is_static_object(obj)


def _static_snapshot(root: Any) -> list[tuple[str, Any, Any]]:
    """``(where, object, state)`` for a static object and each object strict watches inside it
    (``_watched_inside``), reached through attributes (``__dict__``) and items, breadth first
    (``where``: the shortest path from the static object, ``.layers[0]``), each object once,
    at most ``STATIC_WATCH_LIMIT`` of them."""
    found: list[tuple[str, Any, Any]] = []
    seen: set[int] = set()
    agenda = collections.deque([("", root)])
    while agenda and len(found) < STATIC_WATCH_LIMIT:
        where, obj = agenda.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if not isinstance(obj, tuple):  # a tuple cannot change; what it holds can
            found.append((where, obj, _static_state(obj)))
        inside: list[tuple[str, Any]] = []
        if isinstance(obj, dict):
            inside += [(f"{where}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            inside += [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
        elif isinstance(obj, set):
            inside += [(f"{where}<member>", v) for v in obj]
        inside += [(f"{where}.{n}", v) for n, v in getattr(obj, "__dict__", {}).items()]
        agenda.extend((w, v) for w, v in inside if id(v) not in seen and _watched_inside(v))
    return found


def _static_changes(snapshot: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """The entries of a ``_static_snapshot`` whose object changed since."""
    return [(w, o, state) for w, o, state in snapshot if _static_state(o) != state]


def _raise_static_mutation(fun, changed: dict[int, list], pre_def, objs, layout) -> None:
    paths = Paths(pre_def, objs, layout).paths
    lines = []
    for k, found in changed.items():
        where = paths.get(k, "?") or "(the arguments)"
        for inner, _, _ in found:
            if inner:
                lines.append(f"{where}{inner}: changed in place, inside the static object {where}")
            else:
                lines.append(f"{where}: static object changed in place")
    raise mutation_error(fun, lines)


def unstable_static_data(root: Any, info: list) -> set[int]:
    """Nodes whose flatten makes its static data afresh each time (an aux object equal only to
    itself, as ``jax.jit`` allows): a change of their static data cannot be told apart."""
    probe = _native.flatten_shared(root)[1].node_info()
    return {
        k
        for k, (a, b) in enumerate(zip(info, probe, strict=False))
        if isinstance(a, NodeInfo) and isinstance(b, NodeInfo) and not same_data(a.data, b.data)
    }


def _reordered(seen: Any, now: tuple) -> bool:
    """Whether the function moved a key it kept: ``seen`` is the order it saw, ``now`` the
    order it left. A dict keeps the keys never deleted first, in their order, ahead of every
    key inserted since, so anything else in ``now`` means a kept key was deleted and added back
    (after a new key, say), and the caller's dict must end exactly in ``now``'s order, as in
    plain Python. Unknown ``seen``: assume so."""
    if seen is None:
        return True
    present = set(now)
    kept = [k for k in seen if k in present]
    return list(now[: len(kept)]) != kept


def holds_tracer(data: Any) -> bool:
    """Whether a node's static data holds a traced value (it would leak into the caller)."""
    if isinstance(data, Tracer):
        return True
    try:
        return any(isinstance(x, Tracer) for x in jax.tree_util.tree_leaves(data))
    except Exception:
        return False


def watch_callers(
    callers: Sequence[Any], objs: list, info: list, skip: frozenset[int] | set[int] = frozenset()
) -> dict[int | tuple[int, str], tuple[Any, tuple]]:
    """What each of the caller's containers (``callers``, per node of ``info``) that the
    function does not get itself (it gets ``objs``, rebuilt; nodes in ``skip`` are left out)
    holds one level down: it may reach the caller's through a global or a closure, and a
    change made there would be lost (rule 25). A registered node's flatten may read its
    children through a plain dict or list held in an attribute (``self._store["w"]``): such a
    container, when it holds one of the node's children, is watched too, under
    ``(node, attribute)``. :func:`check_callers` compares after."""
    watched: dict[int | tuple[int, str], tuple[Any, tuple]] = {}
    for k, e in enumerate(info):
        if k in skip or not isinstance(e, NodeInfo) or e.node_type is NoneType:
            continue
        obj = callers[k]
        if objs[k] is obj:
            continue
        watched[k] = (obj, shallow_state(obj))
        if e.arity and not isinstance(obj, (list, dict)):
            children = {id(callers[c]) for c in e.children}
            for name, value in list(getattr(obj, "__dict__", {}).items()):
                held = value.values() if isinstance(value, dict) else value
                if isinstance(value, (dict, list)) and any(id(v) in children for v in held):
                    watched[(k, name)] = (value, shallow_state(value))
    return watched


def check_callers(
    fun: Callable[..., Any],
    callers: Sequence[Any],
    watched: dict[int | tuple[int, str], tuple[Any, tuple]],
    pre_def: Any,
    objs: list,
    layout: Layout,
) -> None:
    """Rule 25's ValueError when ``fun`` changed one of the ``watched`` caller containers
    through another name than its argument; those containers are put back first."""
    touched = [key for key, (obj, state) in watched.items() if shallow_state(obj) != state]
    if touched:
        for key in touched:
            _restore_shallow_state(*watched[key])
        _raise_changed_elsewhere(fun, touched, pre_def, objs, layout)


def report_off(mode: str | None) -> bool:
    """Whether discarded changes go unreported, as the block, ``mode`` or the global say."""
    return discarded_mode(mode) == "off"


def report_discarded(
    fun: Callable[..., Any],
    lines: list[str],
    mode: str | None,
    policy: str = "'clone' (what jax.jit does)",
) -> None:
    """Warn about (or raise for) the changes ``lines`` (``path: what``) that ``fun`` made in
    place and that ``clone`` discards, as the block's, the function's (``mode``) or the
    global setting says."""
    chosen = discarded_mode(mode)
    if chosen == "off" or not lines:
        return
    name = getattr(fun, "__qualname__", None) or repr(fun)
    text = (
        f"{name} changed its inputs in place without returning them; under policy {policy} "
        "these changes are discarded and the caller's objects keep their old values:\n"
        + "\n".join(f"  {line}" for line in lines)
        + "\nReturn the changed objects, or use policy='alias' to apply such changes to the "
        "caller's objects. (treeclone.set_discarded_mutations, or discarded_mutations= on "
        "treeclone.jit, says 'off' or 'error' instead of this warning.)"
    )
    if chosen == "error":
        raise MutationError(text)
    code = getattr(inspect.unwrap(fun), "__code__", None)
    if code is None:
        warnings.warn(text, MutationWarning, stacklevel=3)
    else:  # at the user's function: the trace that finds it runs deep inside jax
        warnings.warn_explicit(
            text,
            MutationWarning,
            code.co_filename,
            code.co_firstlineno,
            module=getattr(fun, "__module__", None),
        )


def _raise_changed_elsewhere(fun, touched, pre_def, objs, layout) -> None:
    paths = Paths(pre_def, objs, layout).paths

    def name(key: int | tuple[int, str]) -> str:
        if isinstance(key, tuple):  # a container held in a registered node's attribute
            return f"{paths.get(key[0], '?') or '(the arguments)'}.{key[1]}"
        return paths.get(key, "?") or "(the arguments)"

    where = ", ".join(name(k) for k in touched)
    qualname = getattr(fun, "__qualname__", None) or repr(fun)
    raise ValueError(
        f"{qualname} changed {where} through another name than its argument (a global, a "
        "closure, an attribute of another object) while that object was also passed in. "
        "The function works on the argument, so the two changes cannot both reach the "
        "caller's object; it was put back as it was. Change it through the argument only."
    )


def raise_outside_attribute(fun, k, name, pre_def, objs, layout) -> None:
    where = Paths(pre_def, objs, layout).paths.get(k, "?") or "(the arguments)"
    qualname = getattr(fun, "__qualname__", None) or repr(fun)
    raise ValueError(
        f"{qualname} set the attribute {name!r} on {where} ({type(objs[k]).__name__}), which "
        "its pytree flatten does not carry, so the call cannot hand it back to the caller's "
        "object. Make it part of the node's flatten, or set it outside the transformed "
        "function."
    )


def _raise_traced_static_data(fun, k, pre_def, objs, layout) -> None:
    where = Paths(pre_def, objs, layout).paths.get(k, "?") or "(the arguments)"
    name = getattr(fun, "__qualname__", None) or repr(fun)
    raise ValueError(
        f"{name} stored a traced value in the static data of {where} "
        f"({type(objs[k]).__name__}: a field its pytree flatten keeps as aux data, not as a "
        "leaf). Static data must be concrete: make that field a leaf, or compute it outside "
        "the transformed function."
    )


def _raise_mutation_error(fun, bad, pre_def, objs, layout) -> None:
    raise mutation_error(fun, _mutation_lines(bad, pre_def, objs, layout))


def _mutation_lines(bad, pre_def, objs, layout) -> list[str]:
    """``path: what`` for each change of ``bad``, ``(node, changes)`` pairs (``_describe``)."""
    paths = Paths(pre_def, objs, layout)
    lines = []
    for k, changes in bad:
        for j, what, now in changes:
            where = paths.paths.get(k, "?") if j is None else paths.child(k, j, now)
            lines.append(f"{where or '(the arguments)'}: {what}")
    return lines


_REMEDY = (
    "Return the mutated object, or use policy='alias' to apply such mutations to the "
    "caller's objects, or policy='clone' to discard them."
)


def mutation_error(
    fun: Callable[..., Any], lines: list[str], remedy: str = _REMEDY
) -> MutationError:
    """The strict policy's error: one line per unreturned mutation (``path: what``), then
    ``remedy``, what to do instead (the loops give their own where alias would not apply the
    change as the default text says)."""
    name = getattr(fun, "__qualname__", None) or repr(fun)
    return MutationError(
        f"{name} mutated its inputs in place without returning them (policy 'strict'):\n"
        + "\n".join(f"  {line}" for line in lines)
        + "\n"
        + remedy
    )
