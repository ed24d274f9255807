"""What alias writes back: for each container of the inputs the function changed, the
``Origin`` that tells the native ``CallPlan`` how to write the new contents into the caller's
object (rule J20: entry by entry; a custom node by its changed attributes), which argument's
policy each container follows, and where the arguments' leaves are after a call
(``jit_partial``'s cache).

This is the one place to change "what alias writes back": ``container_writes`` decides it per
container, ``CallPlan`` (``rust/writeback``) carries it out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from types import NoneType
from typing import Any

from treeclone import _native
from treeclone._docs import see
from treeclone._effects.diff import reordered
from treeclone._effects.messages import policy_name, qualname
from treeclone._effects.tree import (
    Layout,
    NodeInfo,
    Paths,
    argument_tops,
    equal_empty_nodes,
    holds_tracer,
    same_data,
)
from treeclone._jax_compat import unflatten_node
from treeclone._native import EntryInfo, Origin
from treeclone._writeback import (
    InPlace,
    attribute_names,
    changed_attributes,
    has_updater,
    writable,
)
from treeclone.policies import Policy


def node_policies(
    fun: Callable[..., Any],
    pre_def: Any,
    info: list,
    objs: list,
    layout: Layout,
    arg_policies: Sequence[Policy],
    named: Sequence[bool] | None = None,
) -> dict[int, Policy]:
    """The policy of each container of the arguments: its argument's. A container reachable
    from two arguments with different policies has no single answer (written back for one,
    left alone for the other): a ValueError naming both key paths (rule P4). But where
    ``named`` says the policy dict did not name an argument (it gave no ``...``: the default
    is for data no named argument holds), a container of that argument that a named one also
    holds follows the named one, with everything under it (rule P5: ``p(model.layer)`` with
    ``model`` bound to ``jit_partial``)."""
    tops = [top for top, _ in argument_tops(info, layout)]
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
    if named is not None:  # rule P5: containers of unnamed arguments claimed by named ones
        agenda = [(info[n].target, a) for n, a in refs if named[a]]
        while agenda:
            target, a = agenda.pop()
            first = owner.get(target)
            if first is None or named[first]:
                continue
            for m in range(target - info[target].size + 1, target + 1):
                entry = info[m]
                if isinstance(entry, NodeInfo) and not named[owner[m]]:
                    found[m], owner[m] = arg_policies[a], a
                elif isinstance(entry, EntryInfo.Ref):
                    agenda.append((entry.target, a))
    for n, a in refs:  # a container met again: in its first place's tree, or another's
        target = info[n].target
        first = owner.get(target)
        if named is not None and not named[a]:
            continue  # an unnamed argument's place: the container follows its first one's
        if first is not None and arg_policies[first] != arg_policies[a]:
            paths = Paths(pre_def, objs, layout).paths
            name = qualname(fun)
            raise ValueError(
                see(
                    "one-container-two-policies",
                    f"{name}: the {type(objs[target]).__name__} at {paths.get(target, '?')} "
                    f"(policy {policy_name(arg_policies[first])}) is also at "
                    f"{paths.get(n, '?')} (policy {policy_name(arg_policies[a])}): one container "
                    "cannot be both written back and left alone. Pass it through one argument, "
                    "or give both arguments one policy.",
                )
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
    """Whether a dict or list subclass node can be written entry by entry (rule J20): rebuilt
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


def kept_container(own: Mapping[str, Any], name: str, now: Any) -> bool:
    """Whether attribute ``name`` holds, after the call, the plain dict or list it held before
    (``own``): the function changed it in place, or left it alone."""
    before = own.get(name)
    return before is now and type(now) in (dict, list)


def written_by_attributes(ty: type, obj: Any) -> bool:
    """Whether the write-back gives container ``obj`` (of node type ``ty``) the function's
    changes by setting its attributes: a custom node that can be written, without an updater
    of its own (``register_inplace``)."""
    return ty not in (list, dict) and writable(obj) and not has_updater(obj)


class Writes:
    """What ``container_writes`` found: ``origin_of``, the native ``Origin`` of each result node
    written into a caller's container; ``origin_node``, the input node of each origin;
    ``found``, the result nodes that are input containers (the function's result holds them
    again), in order; ``custom``, for those of them that are not a plain list or dict, ``(keys,
    outside)``: a dict subclass's keys before and after, in child order, for describing the
    change, and the attributes the function set on it that its pytree flatten does not carry
    (no write-back can hand them on).

    Plain lists and dicts get no record of their own (only their result node in ``found``):
    a trace meets one per container of the arguments, and every object kept alive until the
    end of the pass is more work for Python's cyclic garbage collector during it."""

    __slots__ = ("custom", "found", "held", "mutated", "origin_node", "origin_of")

    def __init__(self) -> None:
        self.origin_of: dict[int, Any] = {}
        self.origin_node: dict[int, int] = {}  # result node -> input node
        self.found: list[int] = []
        self.custom: dict[int, tuple[tuple[Any, Any] | None, list[str]]] = {}
        self.held: dict[int, HeldLeaves] = {}
        self.mutated: list[tuple[int, list]] = []  # filled by ``Called.diff``


class HeldLeaves:
    """A custom node written back by its changed attributes, whose other attributes hold input
    leaves the function left as they were (``held``: ``(input slot, attribute)``): when the
    computation outputs such a leaf in place of the caller's (it was donated, or resharded by
    ``in_shardings``, or placed by ``out_shardings``), its attribute is written too
    (:meth:`origin`), as a dict's entry is (rule J7). ``options``: the node's ``Origin``'s
    arguments; ``after`` and ``children``: the node rebuilt from the function's contents and
    those contents, for the direct writes."""

    __slots__ = ("after", "children", "held", "options")

    def __init__(self, held: list, options: dict, after: Any, children: list) -> None:
        self.held, self.options, self.after, self.children = held, options, after, children

    def origin(self, produced: Collection[int]) -> Any:
        """The node's ``Origin`` when the input slots ``produced`` are the computation's
        outputs (None: the one found at trace time holds)."""
        extra = tuple(name for s, name in self.held if s in produced)
        if not extra:
            return None
        attrs = (*self.options["attrs"], *extra)
        direct = direct_writes(attrs, self.after, self.children)
        return Origin(**{**self.options, "attrs": attrs, "direct": direct})


def _held_leaves(
    pre: NodeInfo, info: tuple[list, list], after: Any, attrs: tuple[str, ...]
) -> list[tuple[int, str]]:
    """``(input slot, attribute)`` for each attribute of ``after`` (not among ``attrs``) that
    holds one of the node's input leaves as it came in."""
    pre_info, objs = info
    leaves: dict[int, tuple[int, Any]] = {}
    for c in pre.children:
        entry = pre_info[c]
        if isinstance(entry, EntryInfo.Leaf):
            leaves.setdefault(id(objs[c]), (entry.slot, objs[c]))
    held = []
    for name in attribute_names(after):
        if name in attrs:
            continue
        value = getattr(after, name, None)
        found = leaves.get(id(value))
        if found is not None and found[1] is value:
            held.append((found[0], name))
    return held


def container_writes(
    before: tuple[list, list],
    after: tuple[list, list],
    container_index: dict[int, int],
    own_attributes: dict[int, dict[str, Any]],
    traced_static: Callable[[int], None],
) -> Writes:
    """How the write-back treats each input container the function's result holds: the
    native ``Origin`` that writes its new contents into the caller's object (:class:`Writes`).

    ``before`` and ``after``: the node info and the objects of the flattens before the call
    and after it; ``container_index``: input node by ``id`` of its object; ``own_attributes``:
    the attributes each custom input node had before the call; ``traced_static(k)`` raises
    for input node ``k`` holding a tracer in its static data.

    One pass over the result, the plain list and dict inline: it runs once per container of
    the arguments at every trace."""
    pre_info, objs = before
    post_info, post_objs = after
    writes = Writes()
    origin_of, origin_node = writes.origin_of, writes.origin_node
    for n, entry in enumerate(post_info):
        if not isinstance(entry, NodeInfo):
            continue
        ty, obj = entry.node_type, post_objs[n]
        k = container_index.get(id(obj))
        if k is None or ty is NoneType:
            continue
        pre = pre_info[k]
        old = pre.children  # bound once: each read of ``children`` builds a new list
        if ty is list or ty is dict:
            # Rule J20: a list's or dict's items are written entry by entry, those the
            # function changed only. A dict's function saw the keys sorted, as under jax.jit:
            # the keys it kept keep their place in the caller's dict (rule J9), ``key_order``;
            # ``old_keys``: the keys at call start. A list has neither (None, the default).
            is_dict = ty is dict
            origin = Origin(
                node=k,
                old_children=old,
                same_data=same_data(pre.data, entry.data),
                writable=True,
                key_order=tuple(obj) if is_dict else None,
                reordered=False,
                by_entry=True,
                old_keys=tuple(pre.data) if is_dict else None,
            )
        else:
            if written_by_attributes(ty, obj) and holds_tracer(entry.data):
                traced_static(k)
            origin, keys, outside, held = _custom_write(
                k, n, before, after, own_attributes.get(k, {})
            )
            writes.custom[n] = (keys, outside)
            if held is not None:
                writes.held[n] = held
        origin_of[n], origin_node[n] = origin, k
        writes.found.append(n)
        for j, c in enumerate(entry.children):
            # A leafless node replaced by an equal one (nnx's PytreeState, rebuilt by every
            # unflatten; rule J14) stands for the caller's own: its parent stays unchanged.
            if (
                j < len(old)
                and c not in origin_of
                and id(post_objs[c]) not in container_index
                and equal_empty_nodes(pre_info[old[j]], post_info[c])
            ):
                origin_of[c] = Origin(node=old[j], old_children=[], same_data=True, writable=False)
                origin_node[c] = k
    return writes


def _custom_write(
    k: int,
    n: int,
    before: tuple[list, list],
    after: tuple[list, list],
    own: Mapping[str, Any],
) -> tuple[Any, tuple[Any, Any] | None, list[str], HeldLeaves | None]:
    """``container_writes`` for input node ``k`` at node ``n`` of the result, a node other than
    a plain list or dict: ``(origin, keys, outside, held)``. ``before`` and ``after``: the
    node info and the objects of the flattens before and after the call; ``own``: the
    attributes the node's object had before the call, with their values. ``held``: the
    attributes holding input leaves left as they came (:class:`HeldLeaves`; None: none, or
    the node is not written by its attributes).

    A changed attribute that holds the same plain dict or list as before the call (a flatten
    that reads its children from ``self.d``, whose entries the function set) is named as
    ``InPlace``: write-back updates the caller's container there entry by entry, as plain
    Python did, instead of setting the attribute to a new one."""
    (pre_info, objs), (post_info, post_objs) = before, after
    pre, post, obj = pre_info[k], post_info[n], post_objs[n]
    ty = post.node_type
    attrs, keys, outside, direct = None, None, [], None
    by_entry, old_keys = False, None
    held_leaves: list[tuple[int, str]] = []
    rebuilt = None
    if written_by_attributes(ty, obj):
        attrs, keys, rebuilt = custom_changes(pre, post, objs, post_objs)
        if attrs is not None:
            held_leaves = _held_leaves(pre, before, rebuilt, attrs)
        if attrs:
            attrs = tuple(
                InPlace(name) if kept_container(own, name, getattr(obj, name, None)) else name
                for name in attrs
            )
        # Rule J20: a dict or list subclass whose unflatten keeps its children is written entry
        # by entry too.
        by_entry, old_keys = entrywise(pre, objs)
        direct = direct_writes(attrs, rebuilt, [post_objs[c] for c in post.children])
        outside = [
            name
            for name in getattr(obj, "__dict__", ())
            if name not in own and not hasattr(rebuilt, name)
        ]
    key_order = tuple(obj) if isinstance(obj, dict) else None
    # A defaultdict was seen with its keys sorted (rule J9); other dict kinds in their own
    # order, which the function may change.
    options: dict[str, Any] = {
        "node": k,
        "old_children": pre.children,
        "same_data": same_data(pre.data, post.data),
        "writable": writable(obj),
        "key_order": key_order,
        "reordered": key_order is not None
        and ty is not defaultdict
        and reordered(keys and keys[0], key_order),
        "attrs": attrs,
        "direct": direct,
        "by_entry": by_entry,
        "old_keys": None if old_keys is None else tuple(old_keys),
    }
    held = None
    if held_leaves:
        children = [post_objs[c] for c in post.children]
        held = HeldLeaves(held_leaves, options, rebuilt, children)
    return Origin(**options), keys, outside, held
