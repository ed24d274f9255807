"""What a function did to its inputs: each container compared before and after the call.

``describe_changes`` says, in words, what changed in one container; ``flatten_after`` and
``returned_nodes`` find the containers the result holds.
"""

from __future__ import annotations

from typing import Any

from treeclone import _native
from treeclone._effects.tree import NodeInfo, Paths, equal_empty_nodes, same_data
from treeclone._native import EntryInfo


def describe_changes(
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
    no change); ``keys``: a dict subclass's keys before and after, in child order (a plain
    dict's are its static data);
    ``static_comparable``: whether a change of the static data can be told (see
    ``unstable_static_data``)."""
    ty, old, new = pre.node_type, pre.children, post.children
    old_arity, old_data, new_arity, new_data = pre.arity, pre.data, post.arity, post.data
    changes: list[tuple[int | None, str, Any]] = []
    if ty is dict:
        keys = (old_data, new_data)
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


def flatten_after(root: Any, out: Any, objs: list, container_index: dict[int, int]) -> tuple:
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


def cyclic_part(
    root: Any, out: Any, before: tuple[Any, list], container_index: dict[int, int], layout: Any
) -> tuple[str, int | None, ValueError] | None:
    """Where ``flatten_after`` met a cycle, named for the user (its own message names the
    internal tree ``(inputs, result, detached)``: ``[2][0]``): ``(what, input node, error)``,
    ``what`` an argument's name, ``"result"``, or None for an input container the function
    detached from the arguments (its node given), ``error`` the cycle's ``ValueError`` naming
    that root (``the list at state['a'] contains itself at relative key path [1]``). None: no
    cycle found. ``before``: the inputs' structure before the call and its objects."""
    pre_def, objs = before
    args, kwargs = layout.split(root)
    named = [(layout.arg_name(i), a) for i, a in enumerate(args)]
    named += [(str(k), v) for k, v in kwargs.items()]
    named.append(("result", out))
    for name, value in named:
        try:
            _native.check(value, name if name != "result" else "the result")
        except ValueError as exc:
            return name, None, exc
    reached = {id(o) for o in _native.flatten_shared((root, out))[2]}
    paths: dict[int, str] | None = None
    for k in container_index.values():
        if id(objs[k]) in reached:
            continue
        if paths is None:
            paths = Paths(pre_def, objs, layout).paths
        try:
            _native.check(objs[k], paths.get(k, "?"))
        except ValueError as exc:
            return paths.get(k, "?"), k, exc
    return None


def returned_nodes(post_info: list, post_objs: list, container_index: dict[int, int]) -> set[int]:
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


def reordered(seen: Any, now: tuple) -> bool:
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
