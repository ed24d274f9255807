"""The loop's own rules, at trace time, for ``treeclone.scan``, ``fori_loop`` and
``while_loop`` (``carry``'s :class:`~treeclone.loops.carry.LoopCall` applies them): the
names of a loop's inputs, what a body did to a container (a shallow diff), the body's slice of
an ``xs`` that is not written back (:class:`SliceWatch`), the carry's structure at every
iteration, and one container given two policies (:func:`check_shared`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.core import Tracer

from treeclone import _effects
from treeclone._docs import see
from treeclone._effects import qualname
from treeclone._lift import (
    ArgsBox,
    LiftRecord,
    Naming,
    Out,
    StaticLeaves,
    StaticOut,
    flatten_call,
    with_static,
)
from treeclone._native import EntryInfo
from treeclone.policies import Policy

__all__ = [
    "CONDITION_REMEDY",
    "NAMINGS",
    "SLICE_REMEDY",
    "STAND_INS",
    "UNRETURNED_REMEDY",
    "XS_NAMING",
    "SliceWatch",
    "changed",
    "check_shared",
    "containers",
    "join_static",
    "not_a_jax_type",
    "raise_not_a_jax_type",
    "same_structure",
    "shallow_changes",
    "slice_of",
    "snapshot",
    "split_static",
    "split_xs",
    "stand_in",
    "structure_difference",
]

NodeInfo = EntryInfo.Node
LeafInfo = EntryInfo.Leaf
RefInfo = EntryInfo.Ref
_NoneType: type = type(None)


def stand_in(api: str, params: tuple[str, ...]) -> Callable[..., None]:
    """A function with the given argument names: a policy dict is checked against the loop's,
    and messages name the loop's inputs by them (``init``, ``xs``, ``init_val``)."""

    def arguments(*args: Any) -> None:
        return None

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    arguments.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, kind) for name in params]
    )
    arguments.__qualname__ = arguments.__name__ = api
    return arguments


STAND_INS = {
    "scan": stand_in("scan", ("init", "xs")),
    "fori_loop": stand_in("fori_loop", ("init_val",)),
    "while_loop": stand_in("while_loop", ("init_val",)),
}
NAMINGS = {api: Naming(f) for api, f in STAND_INS.items()}
XS_NAMING = Naming(stand_in("scan", ("xs",)))

# --- what a body did to a container: a shallow diff, for the loop's own rules --------------------


def _state(obj: Any) -> tuple:
    """What a container holds one level down, by identity: its attributes and items, and the
    children its pytree flatten gives (an nnx Variable's value, which is in no ``__dict__``)."""
    attrs, items = _effects.shallow_state(obj)
    try:
        children = jax.tree_util.tree_flatten(obj, is_leaf=lambda x: x is not obj)[0]
        flat: Any = [_effects.Same(c) for c in children]
    except Exception:  # noqa: BLE001 - what the shallow state shows is all there is to compare
        flat = None
    return attrs, items, flat


def shallow_changes(path: str, obj: Any, before: tuple) -> list[str]:
    """``path: what`` lines for what changed in ``obj`` since its shallow state ``before``."""
    attrs, items = before[:2]
    now_attrs, now_items = _effects.shallow_state(obj)
    lines = []
    if isinstance(obj, dict):
        old, new = dict(items), dict(now_items)
        added = [k for k in new if k not in old]
        removed = [k for k in old if k not in new]
        if added:
            lines.append(f"{path}: key added: {', '.join(map(repr, added))}")
        if removed:
            lines.append(f"{path}: key removed: {', '.join(map(repr, removed))}")
        lines += [f"{path}[{k!r}]: replaced" for k in old if k in new and old[k] != new[k]]
    elif isinstance(obj, list):
        if len(items) != len(now_items):
            lines.append(f"{path}: list resized from {len(items)} to {len(now_items)}")
        else:
            pairs = zip(items, now_items, strict=True)
            lines += [f"{path}[{i}]: replaced" for i, (a, b) in enumerate(pairs) if a != b]
    for name in dict.fromkeys([*attrs, *now_attrs]):
        if attrs.get(name) != now_attrs.get(name):
            lines.append(f"{path}.{name}: {'replaced' if name in attrs else 'attribute set'}")
    return lines or [f"{path}: changed in place"]


def containers(info: list, skip: set[int]) -> Iterator[int]:
    """The nodes of ``info`` that are containers (not None, not in ``skip``)."""
    for k, e in enumerate(info):
        if k not in skip and isinstance(e, NodeInfo) and e.node_type is not _NoneType:
            yield k


def snapshot(objs: list, info: list, skip: set[int]) -> dict[int, tuple]:
    """The shallow state of each mutable container among ``objs`` (a tuple cannot change)."""
    return {k: _state(objs[k]) for k in containers(info, skip) if not isinstance(objs[k], tuple)}


def changed(objs: list, before: dict[int, tuple]) -> list[int]:
    """The containers among ``objs`` whose shallow state is no longer ``before``'s."""
    return [k for k, state in before.items() if _state(objs[k]) != state]


# What strict's MutationError offers instead, where alias would not apply the change.
UNRETURNED_REMEDY = (
    "Return the changed container at its place in the carry (policy 'alias' then writes the "
    "final state into the caller's object), or build a new object there without changing the "
    "old one; under policy 'alias' this body is a ValueError too, and policy='clone' discards "
    "the change."
)
CONDITION_REMEDY = (
    "Change the carry in the body: a JAX while_loop carries only what the body returns, so "
    "under policy 'alias' a condition that changes it is a ValueError too, and "
    "policy='clone' discards the change."
)
SLICE_REMEDY = (
    "Return the changed slice (in the carry or in ys), or use policy='alias', which writes "
    "what the body leaves in each slice back into the stacked xs (row i of each leaf, as "
    "nnx.scan does for what it scans over axis 0), or policy='clone' to discard the change."
)


class SliceWatch:
    """Scan's slice of an ``xs`` that is not written back (``strict``, or ``clone`` in a call
    mixing policies): the containers the body changes in place and does not return are
    strict's error, or reported as discarded (``mutations`` ``"discard"``). ``"shared"``: an
    ``alias`` xs that shares an array with ``init``, so that its slice cannot be written back:
    a change to it is a ValueError."""

    def __init__(self, tree: Any, mutations: str):
        self.mutations = mutations
        self.call = flatten_call(XS_NAMING, (tree,), {})
        info: list[Any] = self.call.sdef.node_info()
        self.snapshot = snapshot(self.call.objects, info, {len(info) - 1, info[-1].children[1]})

    def check(self, fun: Any, returned: Any) -> None:
        objs = self.call.objects
        bad = changed(objs, self.snapshot)
        if not bad:
            return
        if self.mutations != "shared":
            reached = {id(o) for o in flatten_call(XS_NAMING, (returned,), {}).objects}
            bad = [k for k in bad if id(objs[k]) not in reached]
        if bad:
            paths = _effects.Paths(self.call.sdef, objs, _effects.Layout(1, ["xs"])).paths
            lines = [
                x
                for k in bad
                for x in shallow_changes(paths.get(k, "?"), objs[k], self.snapshot[k])
            ]
            if self.mutations == "shared":
                raise ValueError(
                    see(
                        "loop-slice",
                        f"{qualname(fun)} changed its slice of xs in place:\n"
                        + "\n".join(f"  {line}" for line in lines)
                        + "\nxs shares an array with init, which the loop carries, so the slice "
                        "cannot be written back into xs; pass a copy of that array in one of them.",
                    )
                )
            if self.mutations == "discard":  # xs left alone (a policy per argument)
                _effects.report_discarded(fun, lines, None, "'clone' (chosen for xs)")
                return
            raise _effects.mutation_error(fun, lines, SLICE_REMEDY)


def same_structure(a: list, b: list, unstable: set[int]) -> bool:
    """Whether two node infos are one structure, leaf sharing aside (a body may give two
    places one value; that it may not split one array in two is checked by the caller)."""
    if len(a) != len(b):
        return False
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if type(x) is not type(y):
            return False
        if isinstance(x, RefInfo):
            if x.target != y.target:
                return False
        elif isinstance(x, NodeInfo):
            if x.node_type is not y.node_type or x.arity != y.arity:
                return False
            if k not in unstable and not _effects.same_data(x.data, y.data):
                if not _effects.equal_empty_nodes(x, y):
                    return False
    return True


def structure_difference(name: str, old: Any, new: Any) -> str | None:
    """Where ``new`` first differs from ``old`` in structure, in words (None: nowhere but in
    its sharing)."""
    try:
        flat = jax.tree_util.tree_flatten_with_path
        old_paths = [jax.tree_util.keystr(p) for p, _ in flat(old)[0]]
        new_paths = [jax.tree_util.keystr(p) for p, _ in flat(new)[0]]
    except Exception:  # noqa: BLE001 - a description is best effort
        return "the structures differ"
    old_set, new_set = set(old_paths), set(new_paths)
    added = [p for p in new_paths if p not in old_set]
    removed = [p for p in old_paths if p not in new_set]
    parts = []
    if added:
        parts.append("added " + ", ".join(name + p for p in added[:5]))
    if removed:
        parts.append("removed " + ", ".join(name + p for p in removed[:5]))
    if parts:
        return "; ".join(parts)
    old_def: Any = jax.tree_util.tree_structure(old)
    new_def = jax.tree_util.tree_structure(new)
    return f"{old_def} became {new_def}" if old_def != new_def else None


def check_shared(f: Any, init: Any, xs: Any, policies: tuple[Policy, Policy]) -> None:
    """A container in both ``init`` and ``xs``, given different policies, has no single answer
    (written back for one, left alone for the other): the ValueError jit raises, naming both
    key paths (docs/semantics.md, rule P4)."""
    both = flatten_call(NAMINGS["scan"], (init, xs), {})
    info = both.sdef.node_info()
    init_top, xs_top = info[-1].children[:2]
    first = init_top - (info[init_top].size if isinstance(info[init_top], NodeInfo) else 1)
    for n in range(init_top + 1, xs_top + 1):
        e = info[n]
        if isinstance(e, RefInfo) and first < e.target <= init_top:
            target = info[e.target]
            if isinstance(target, NodeInfo) and target.node_type is not _NoneType:
                paths = _effects.Paths(both.sdef, both.objects, _effects.Layout(2, ["init", "xs"]))
                a, b = (_effects.policy_name(p) for p in policies)
                raise ValueError(
                    see(
                        "one-container-two-policies",
                        f"{qualname(f)}: the {type(both.objects[e.target]).__name__} at "
                        f"{paths.paths.get(e.target)} (policy {a}) is also at {paths.paths.get(n)} "
                        f"(policy {b}): one container cannot be both written back and left alone. "
                        "Pass it through one argument, or give both arguments one policy.",
                    )
                )


# --- traced=: the leaves a loop leaves static ----------------------------------------------------


def not_a_jax_type(where: str, leaf: Any, verb: str, traced: Any) -> str:
    """The message for a leaf at ``where`` that is not a JAX type, ``verb`` (carried or
    scanned) by a loop; without a ``traced=`` rule, it names the one that leaves it static.

    >>> from treeclone.loops.rules import not_a_jax_type
    >>> not_a_jax_type("init.act", abs, "carried", None)[:60]
    'init.act: a value of type builtin_function_or_method, which '
    """
    text = (
        f"{where}: a value of type {type(leaf).__name__}, which is not a valid JAX type, "
        f"cannot be {verb} by a loop"
    )
    if traced is None:
        text += (
            '. Pass traced="arrays" to the loop to leave every leaf that is not an array '
            "static, a constant of the loop (as eqx.partition around a JAX loop does)"
        )
    return text


def raise_not_a_jax_type(error: TypeError, names: tuple[str, ...], args: tuple) -> None:
    """Under ``clone`` (JAX's own loop): when ``error`` is JAX's for a leaf of ``args`` (named
    ``names``) that is not a JAX type, the TypeError :func:`not_a_jax_type` words, naming
    its key path; else nothing (the caller raises ``error``)."""
    for name, arg in zip(names, args, strict=True):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            try:
                jax.api_util.shaped_abstractify(leaf)
            except TypeError:
                where = name + jax.tree_util.keystr(path)
                verb = "scanned" if name == "xs" else "carried"
                raise TypeError(not_a_jax_type(where, leaf, verb, None)) from error


def split_static(tree: Any, traced: Any) -> Out:
    """A loop's result ``tree`` (scan's ``y``) in an :class:`Out`: the leaves ``traced``
    rejects are kept in its record as they are, out of JAX's sight (never stacked, as
    ``eqx.filter_vmap`` returns a static output); :func:`join_static` rebuilds the tree."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    kept = [x if isinstance(x, Tracer) or traced(x) else StaticOut(x) for x in leaves]
    return Out(LiftRecord(None, treedef), kept)


def join_static(out: Out) -> Any:
    """The tree :func:`split_static` split, its static leaves back."""
    return out.record.extra.unflatten(out.leaves)


def split_xs(xs: Any, traced: Any) -> ArgsBox:
    """Scan's ``xs`` (not written back) as the JAX loop scans it: its leaves, each that
    ``traced`` rejects None (the same in every slice, never sliced), in an :class:`ArgsBox`
    keyed on the structure and the static leaves (hashed, as ``jit`` hashes them; an
    unhashable one is the TypeError naming its key path); :func:`slice_of` rebuilds a slice."""
    leaves, treedef = jax.tree_util.tree_flatten(xs)
    static = StaticLeaves.of(leaves, traced, (xs,), {}, XS_NAMING)
    kept = (
        leaves
        if static is None
        else [None if s in static.slots else x for s, x in enumerate(leaves)]
    )
    return ArgsBox(kept, (treedef, static))


def slice_of(box: ArgsBox) -> Any:
    """The slice of ``xs`` the body is given, from the JAX loop's slice of :func:`split_xs`'s
    box."""
    treedef, static = box.key
    return treedef.unflatten(with_static(box.leaves, static))
