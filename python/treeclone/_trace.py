"""Running a function on rebuilt inputs and working out what it did to them.

Used at trace time by ``treeclone.jit`` (the leaves are tracers) and eagerly by
``treeclone.call`` (the leaves are the caller's values). The result is a native ``CallPlan``
that rebuilds the outputs (and, under ``alias``, writes the inputs' new contents back into the
caller's objects) at every call, plus the leaves the computation must output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from treeclone import _native
from treeclone._jax_compat import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey, keystr
from treeclone._jax_compat import flatten_one_level_with_keys as _keyed_children
from treeclone._writeback import writable, write_custom
from treeclone.policies import MutationError, Policy

NoneType = type(None)


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


def _same_data(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _subtree_sizes(info: list[tuple]) -> list[int]:
    sizes: list[int] = []
    stack: list[int] = []
    for entry in info:
        arity = entry[2] if entry[0] == "node" else 0
        below = sum(stack[len(stack) - arity :]) if arity else 0
        del stack[len(stack) - arity :]
        sizes.append(below + 1)
        stack.append(below + 1)
    return sizes


def _child_keys(obj: Any, entry: tuple) -> list[Any]:
    """JAX's key entries for the children of a node (trace time only: used for messages)."""
    _, ty, arity, data = entry
    if ty in (list, tuple):
        return [SequenceKey(i) for i in range(arity)]
    if ty is dict:
        return [DictKey(k) for k in data]
    if issubclass(ty, tuple) and hasattr(ty, "_fields"):
        return [GetAttrKey(f) for f in ty._fields]
    try:
        keyed, _ = _keyed_children(obj)
        return [k for k, _ in keyed]
    except Exception:
        return [FlattenedIndexKey(i) for i in range(arity)]


class _Paths:
    """Key paths of the nodes of the (rebuilt) input tree, for error messages."""

    def __init__(self, sdef: Any, objs: list, layout: Layout):
        self.sdef, self.objs, self.layout = sdef, objs, layout
        self.info = sdef.node_info()
        self.paths: dict[int, str] = {}
        root = len(self.info) - 1
        for i, child in enumerate(sdef.children_of(root)):
            if i < layout.num_args:
                self._walk(child, layout.arg_name(i))
            else:  # the kwargs dict: its keys are the argument names
                for key, grandchild in zip(
                    self.info[child][3] or (), sdef.children_of(child), strict=False
                ):
                    self._walk(grandchild, str(key))

    def _walk(self, node: int, path: str) -> None:
        agenda = [(node, path)]
        while agenda:
            n, p = agenda.pop()
            if n in self.paths:
                continue
            self.paths[n] = p
            entry = self.info[n]
            if entry[0] == "node" and entry[2]:
                keys = _child_keys(self.objs[n], entry)
                for key, child in zip(keys, self.sdef.children_of(n), strict=False):
                    agenda.append((child, p + keystr((key,))))

    def child(self, node: int, j: int, now: Any) -> str:
        """Path of child ``j`` of ``node``, whose value is ``now`` after the call."""
        obj = self.objs[node]
        keys = _child_keys(obj, self.info[node])
        key = keystr((keys[j],)) if j < len(keys) else f"[{j}]"
        if j >= len(keys) or isinstance(keys[j], FlattenedIndexKey):
            # A node registered without keys: name the attribute that holds the value, if any.
            for name, value in getattr(obj, "__dict__", {}).items():
                if value is now:
                    key = f".{name}"
                    break
        return self.paths.get(node, "?") + key


def _describe(pre: tuple, post: tuple, old: list, new: list, objs: list, post_objs: list):
    """What changed in one container: ``(child index or None, description, child now)``s."""
    _, ty, old_arity, old_data = pre
    _, _, new_arity, new_data = post
    changes: list[tuple[int | None, str, Any]] = []
    if ty is dict:
        new_pos = {k: i for i, k in enumerate(new_data)}
        added = [k for k in new_data if k not in set(old_data)]
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
    elif not _same_data(old_data, new_data):
        changes.append((None, "attribute set (the node's static data changed)", None))
    if not changes:
        for j, (o, n) in enumerate(zip(old, new, strict=False)):
            if objs[o] is not post_objs[n]:
                changes.append((j, "replaced", post_objs[n]))
        if old_arity != new_arity:
            changes.append((None, f"children changed from {old_arity} to {new_arity}", None))
    return changes


def run(
    fun: Callable[..., Any],
    pre_def: Any,
    in_leaves: list,
    layout: Layout,
    policy: Policy,
    rebuild_args: Callable[[tuple, dict], tuple[tuple, dict]],
    keep_inputs: Sequence[bool] | None = None,
    transform_out: Callable[[Any], Any] | None = None,
) -> tuple[Any, list]:
    """Call ``fun`` on the tree of ``pre_def`` rebuilt from ``in_leaves``.

    Returns ``(plan, output_leaves)``: ``plan.apply(caller_leaves, caller_objects,
    output_leaves)`` gives the call's result (and performs the write-back under ``alias``).
    ``keep_inputs[s]`` false means input slot ``s`` may not be handed back as it came in
    (it was donated): it is output by the computation instead.
    ``rebuild_args`` turns the rebuilt ``(args, kwargs)`` into the function's full arguments
    (putting static arguments back in place); ``transform_out`` is applied to the result.
    """
    root, objs = pre_def.unflatten_nodes(in_leaves)
    args, kwargs = rebuild_args(*layout.split(root))
    out = fun(*args, **kwargs)
    if transform_out is not None:
        out = transform_out(out)

    post_leaves, post_def, post_objs = _native.flatten_shared((root, out))
    pre_info = pre_def.node_info()
    post_info = post_def.node_info()
    container_index = {
        id(o): k
        for k, (o, e) in enumerate(zip(objs, pre_info, strict=True))
        if e[0] == "node" and e[1] is not NoneType
    }
    slot_of = {id(leaf): s for s, leaf in enumerate(in_leaves)}

    # Which input containers changed, and which the function returns.
    post_root = len(post_info) - 1
    inputs_node, out_node = post_def.children_of(post_root)
    sizes = _subtree_sizes(post_info)
    returned: set[int] = set()
    agenda = list(range(inputs_node + 1, out_node + 1))
    expanded: set[int] = set()
    while agenda:
        n = agenda.pop()
        entry = post_info[n]
        if entry[0] == "ref":
            target = entry[1]
            if target not in expanded:  # a returned input: everything under it is returned
                expanded.add(target)
                agenda.extend(range(target - sizes[target] + 1, target + 1))
        elif entry[0] == "node":
            k = container_index.get(id(post_objs[n]))
            if k is not None:
                returned.add(k)
    mutated: list[tuple[int, list]] = []
    origin_of: dict[int, tuple] = {}
    for n, entry in enumerate(post_info):
        if entry[0] != "node" or entry[1] is NoneType:
            continue
        k = container_index.get(id(post_objs[n]))
        if k is None:
            continue
        old, new = pre_def.children_of(k), post_def.children_of(n)
        same = _same_data(pre_info[k][3], entry[3])
        order = tuple(post_objs[n]) if entry[1] is dict else None
        origin_of[n] = (k, old, same, entry[1] in (list, dict) or writable(post_objs[n]), order)
        changes = _describe(pre_info[k], entry, old, new, objs, post_objs)
        if changes:
            mutated.append((k, changes))

    if policy.mutations == "error":
        bad = [(k, c) for k, c in mutated if k not in returned]
        if bad:
            _raise_mutation_error(fun, bad, pre_def, objs, layout)

    # The results: under "propagate" the whole (inputs, outputs) pair, written back into the
    # caller's containers; else only the outputs, as fresh containers.
    if policy.mutations == "propagate":
        result_leaves, result_def = post_leaves, post_def
        origins = [origin_of.get(n) for n in range(len(post_info))]
        result_child = 1
    else:
        result_leaves, result_def, _ = _native.flatten_shared(out)
        origins = [None] * result_def.num_nodes
        result_child = None
    sources, outputs = [], []
    for leaf in result_leaves:
        s = slot_of.get(id(leaf))
        if s is not None and in_leaves[s] is leaf and (keep_inputs is None or keep_inputs[s]):
            sources.append((0, s))
        else:
            sources.append((1, len(outputs)))
            outputs.append(leaf)
    plan = _native.CallPlan(result_def, sources, origins, result_child, write_custom)
    return plan, outputs


def _raise_mutation_error(fun, bad, pre_def, objs, layout) -> None:
    paths = _Paths(pre_def, objs, layout)
    lines = []
    for k, changes in bad:
        for j, what, now in changes:
            where = paths.paths.get(k, "?") if j is None else paths.child(k, j, now)
            lines.append(f"  {where or '(the arguments)'}: {what}")
    name = getattr(fun, "__qualname__", None) or repr(fun)
    raise MutationError(
        f"{name} mutated its inputs in place without returning them (policy 'strict'):\n"
        + "\n".join(lines)
        + "\nReturn the mutated object, or use policy='alias' to apply such mutations to the "
        "caller's objects, or policy='clone' to discard them."
    )
