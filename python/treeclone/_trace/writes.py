"""What alias writes back: for each container of the inputs the function changed, the
``Origin`` that tells the native ``CallPlan`` how to write the new contents into the caller's
object (rule 17: entry by entry; a custom node by its changed attributes), which argument's
policy each container follows, and where the arguments' leaves are after a call
(``jit_partial``'s cache).

This is the one place to change "what alias writes back": ``container_origin`` decides it per
container, ``CallPlan`` (``rust/writeback``) carries it out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from treeclone import _native
from treeclone._jax_compat import unflatten_node
from treeclone._native import EntryInfo, Origin
from treeclone._trace.diff import reordered
from treeclone._trace.messages import policy_name, qualname
from treeclone._trace.tree import Layout, NodeInfo, Paths, equal_empty_nodes, same_data
from treeclone._writeback import changed_attributes, has_updater, writable
from treeclone.policies import Policy


def node_policies(
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
            name = qualname(fun)
            raise ValueError(
                f"{name}: the {type(objs[target]).__name__} at {paths.get(target, '?')} "
                f"(policy {policy_name(arg_policies[first])}) is also at "
                f"{paths.get(n, '?')} (policy {policy_name(arg_policies[a])}): one container "
                "cannot be both written back and left alone. Pass it through one argument, "
                "or give both arguments one policy."
            )
    return found


def next_inputs(
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


def custom_changes(
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


def entrywise(pre: NodeInfo, objs: list) -> tuple[bool, tuple | None]:
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


def direct_writes(
    attrs: tuple[str, ...] | None, after: Any, children: list
) -> list[tuple[str, int]] | None:
    """``(attribute, child index)`` for each changed attribute of a rebuilt custom node that
    holds one of the node's ``children`` itself: write-back then sets those attributes to the
    new children directly, without rebuilding the node (``CallPlan``'s fast path). None when
    some changed attribute holds anything else (derived or converted by the node's unflatten),
    or the node is a dict or list subclass, whose items are written as a dict's or a list's."""
    if attrs is None or isinstance(after, (dict, list)):
        return None
    position: dict[int, int] = {}
    for j, child in enumerate(children):
        position.setdefault(id(child), j)
    direct = []
    missing = object()
    for name in attrs:
        value = getattr(after, name, missing)
        at = position.get(id(value))
        if at is None or children[at] is not value:
            return None
        direct.append((name, at))
    return direct


def written_by_attributes(ty: type, obj: Any) -> bool:
    """Whether the write-back gives container ``obj`` (of node type ``ty``) the function's
    changes by setting its attributes: a custom node that can be written, without an updater
    of its own (``register_inplace``)."""
    return ty not in (list, dict) and writable(obj) and not has_updater(obj)


class ContainerWrite:
    """How the write-back treats one input container the function's result holds (found again
    after the call): ``origin``, the native ``Origin`` that writes the new contents into the
    caller's object; ``keys``, a dict's (or dict subclass's) keys before and after, in child
    order, for describing the change; ``outside``, the attributes the function set on it that
    its pytree flatten does not carry (no write-back can hand them on)."""

    __slots__ = ("keys", "origin", "outside")

    def __init__(self, origin: Any, keys: tuple[Any, Any] | None, outside: list[str]):
        self.origin, self.keys, self.outside = origin, keys, outside


def container_write(
    k: int, pre: NodeInfo, post: NodeInfo, obj: Any, objs: list, post_objs: list, own: set[str]
) -> ContainerWrite:
    """The :class:`ContainerWrite` of input container ``k`` (``pre``: its entry before the
    call), found after the call as ``post``, the object ``obj``; ``objs`` and ``post_objs``
    are the objects of the flattens before and after, ``own`` the attributes ``obj`` had
    before the call."""
    ty = post.node_type
    attrs, keys, outside, direct = None, (pre.data, post.data) if ty is dict else None, [], None
    # Rule 17: a list's or dict's items are written entry by entry, those the function
    # changed only; ``old_keys``: a dict's keys at call start, in child order.
    by_entry, old_keys = ty in (list, dict), pre.data if ty is dict else None
    if written_by_attributes(ty, obj):
        attrs, keys, after = custom_changes(pre, post, objs, post_objs)
        by_entry, old_keys = entrywise(pre, objs)
        direct = direct_writes(attrs, after, [post_objs[c] for c in post.children])
        outside = [
            name
            for name in getattr(obj, "__dict__", ())
            if name not in own and not hasattr(after, name)
        ]
    key_order = tuple(obj) if isinstance(obj, dict) else None
    # The function saw a dict's (and a defaultdict's) keys sorted, as under jax.jit, not in
    # the caller's order: the keys it kept keep their place in the caller's dict (rule 7).
    # Other dict kinds are seen in their own order, which it may change.
    sorted_view = ty is dict or ty is defaultdict
    origin = Origin(
        node=k,
        # Bound once: each read of ``children`` builds a new list.
        old_children=pre.children,
        same_data=same_data(pre.data, post.data),
        writable=ty in (list, dict) or writable(obj),
        key_order=key_order,
        reordered=key_order is not None
        and not sorted_view
        and reordered(keys and keys[0], key_order),
        attrs=attrs,
        direct=direct,
        by_entry=by_entry,
        old_keys=None if old_keys is None else tuple(old_keys),
    )
    return ContainerWrite(origin, keys, outside)
