"""``treeclone.scan``, ``fori_loop`` and ``while_loop`` with a policy.

Each takes the arguments of the JAX loop (``jax.lax.scan``, ``jax.lax.fori_loop``,
``jax.lax.while_loop``) plus ``policy=``. Under ``clone`` (the default) a call is the JAX
loop's own. Under ``alias`` a call behaves as the Python loop it stands for, run on the
caller's objects::

    carry = init                        # scan
    for i in range(n):
        x = tree_map(lambda a: a[i], xs)  # the slice: a view of row i of each leaf
        carry, ys[i] = f(carry, x)
        for a, row in zip(leaves(xs), leaves(x)):
            a[i] = row                  # what the body left in the slice is row i
    return carry, stack(ys)

The body may update the carry in place and return it (an optimizer's ``update`` method, a
counter), or build and return a new one. What it updates in place and returns at the same place
of the carry is the caller's own object at the end, holding the final state (so ``carry is
init`` when the body returns its argument); what it builds anew is a new object. Under
``strict`` a carry container changed in place and not returned at its place is a
:class:`~treeclone.MutationError` naming its key path, and the caller is never written to.

How: the JAX loop carries the distinct leaves of the carry (flattened with identity: an array
at two places is one leaf). At each iteration (traced once) the lifted body rebuilds the carry
from them, runs the user's body, and checks what it returns: the same structure (a key added,
a list grown, a container shared differently is an error naming the key path), and, for each
container, either the input container at the same place (updated in place) or a new one (the
input container then left unchanged). That pattern, the same for every iteration, says how the
final leaves are written into the caller's objects once the loop is done, all or nothing. The
traced functions are kept per kind of call, so that an eager loop called again finds JAX's
cached trace.
``docs/semantics.md`` ("scan, fori_loop and while_loop") states the rules and names their tests.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import jax

from treeclone import _native, _trace
from treeclone._jax_compat import INITIAL_RESULT_PATHS, DebugInfo, fun_sourceinfo, unflatten_node
from treeclone._lift import Naming, reporting
from treeclone._native import EntryInfo
from treeclone._writeback import changed_attributes, write_custom
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy_spec,
    policy_override,
)

__all__ = ["fori_loop", "scan", "while_loop"]

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")

NodeInfo = EntryInfo.Node
LeafInfo = EntryInfo.Leaf
RefInfo = EntryInfo.Ref
_NoneType: type = type(None)


def _stand_in(api: str, params: tuple[str, ...]) -> Callable[..., None]:
    """A function with the loop's argument names, which a policy dict is checked against."""

    def arguments(*args: Any) -> None:
        return None

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    arguments.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, kind) for name in params]
    )
    arguments.__qualname__ = arguments.__name__ = api
    return arguments


_STAND_INS = {
    "scan": _stand_in("scan", ("init", "xs")),
    "fori_loop": _stand_in("fori_loop", ("init_val",)),
    "while_loop": _stand_in("while_loop", ("init_val",)),
}


def _policies_of(policy: PolicySpec | ArgPolicies, api: str) -> tuple[Policy, ...]:
    """The policy of each of the loop's arguments (scan: ``init`` and ``xs``; fori_loop and
    while_loop: ``init_val``), from one policy or a dict naming them by name or position
    (checked as jit checks a dict); a ``with treeclone.policy(...)`` block wins."""
    stand_in = _STAND_INS[api]
    spec = as_policy_spec(policy, stand_in)
    chosen = policy_override.get() or spec
    count = len(inspect.signature(stand_in).parameters)
    if isinstance(chosen, ArgPolicies):
        return chosen.per_argument(range(count), [])
    return (chosen,) * count


def _policy_of(policy: PolicySpec | ArgPolicies, api: str) -> Policy:
    """The policy of a loop of one carry (fori_loop, while_loop): a dict can only name it."""
    return _policies_of(policy, api)[0]


def _qualname(fun: Any) -> str:
    return getattr(fun, "__qualname__", None) or repr(fun)


def _check_cycle(tree: Any, name: str) -> None:
    """A cyclic argument is the ``ValueError`` of every policy, naming the argument, before a
    flatten meets the cycle (docs/semantics.md, rule 14)."""
    _native.check(tree, name)


def _aval(x: Any) -> Any:
    return jax.api_util.shaped_abstractify(x)


# --- what a body did to a container, for messages ------------------------------------------------


def _mutable(obj: Any) -> bool:
    return not isinstance(obj, tuple)


def _state(obj: Any) -> tuple:
    """What a container holds one level down, by identity: its attributes and items, and the
    children its pytree flatten gives (an nnx Variable's value, which is in no ``__dict__``)."""
    attrs, items = _trace.shallow_state(obj)
    try:
        children = jax.tree_util.tree_flatten(obj, is_leaf=lambda x: x is not obj)[0]
        flat: Any = [_trace.Same(c) for c in children]
    except Exception:  # noqa: BLE001 - what the shallow state shows is all there is to compare
        flat = None
    return attrs, items, flat


def _describe(path: str, obj: Any, before: tuple) -> list[str]:
    """``path: what`` lines for what changed in ``obj`` since its shallow state ``before``."""
    attrs, items = before[:2]
    now_attrs, now_items = _trace.shallow_state(obj)
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
            lines += [
                f"{path}[{i}]: replaced"
                for i, (a, b) in enumerate(zip(items, now_items, strict=True))
                if a != b
            ]
    for name in dict.fromkeys([*attrs, *now_attrs]):
        if attrs.get(name) != now_attrs.get(name):
            lines.append(f"{path}.{name}: {'replaced' if name in attrs else 'attribute set'}")
    return lines or [f"{path}: changed in place"]


def _snapshot(objs: list, info: list, skip: set[int]) -> dict[int, tuple]:
    """The shallow state (children by identity) of each mutable container among ``objs``."""
    return {
        k: _state(objs[k])
        for k, e in enumerate(info)
        if k not in skip
        and isinstance(e, NodeInfo)
        and e.node_type is not _NoneType
        and _mutable(objs[k])
    }


def _changed(objs: list, snapshot: dict[int, tuple]) -> list[int]:
    return [k for k, state in snapshot.items() if _state(objs[k]) != state]


# --- the carry -----------------------------------------------------------------------------------


class _Carry:
    """One loop call's carry, flattened with identity, and what the body's trace found.

    ``fun``: the user's body (for messages); ``name``: what messages call the carry
    (``init``, ``init_val``). The carry is flattened as ``(carry, {})``, the tree a one-argument
    call flattens, so that ``_trace``'s key paths name it.

    Under ``alias`` scan's ``xs`` is one too (``sliced``): its leaves are the stacked arrays,
    the body's slice is rebuilt from their rows, and the slice as the body leaves it is what
    the step "returns"; the final rows, stacked by the loop, are written back into the caller's
    ``xs`` as the carry's final leaves are into ``init`` (rule L7)."""

    def __init__(self, fun: Any, init: Any, name: str, policy: Policy, sliced: bool = False):
        _check_cycle(init, name)
        self.fun, self.name, self.policy, self.sliced = fun, name, policy, sliced
        self.leaves, self.sdef, self.objs = _native.flatten_shared((init, {}))
        self.info: list[Any] = self.sdef.node_info()
        self.root = self.sdef.num_nodes - 1
        self.kwargs_node: int = self.sdef.children_of(self.root)[-1]
        self.skip = {self.root, self.kwargs_node}
        self.layout = _trace.Layout(1, [name])
        self._paths: dict[int, str] | None = None
        self.unstable = _trace.unstable_static_data((init, {}), self.info)
        # Set by the body's (last) trace: the containers the body hands back at their own place
        # (updated in place), and the leaves it hands back unchanged.
        self.pattern: tuple[frozenset[int], tuple[bool, ...]] | None = None
        avals = []
        for s, leaf in enumerate(self.leaves):
            try:
                avals.append(_aval(leaf))
            except TypeError:
                raise TypeError(
                    f"{self.slot_path(s)}: a value of type {type(leaf).__name__}, which is not "
                    f"a valid JAX type, cannot be {'scanned' if sliced else 'carried'} by a loop"
                ) from None
        self.avals = tuple(avals)

    def paths(self) -> dict[int, str]:
        if self._paths is None:
            self._paths = _trace.Paths(self.sdef, self.objs, self.layout).paths
        return self._paths

    def path(self, n: int) -> str:
        return self.paths().get(n, "?") or self.name

    def slot_path(self, s: int) -> str:
        for n, e in enumerate(self.info):
            if isinstance(e, LeafInfo) and e.slot == s:
                return self.path(n)
        return f"{self.name}<leaf {s}>"

    # -- at trace time, in the JAX loop's body ----------------------------------------------------

    def slot_names(self, root: str) -> list[str]:
        """Each carried leaf's key path, the carry named ``root`` (for jax's messages)."""
        paths = _trace.Paths(self.sdef, self.objs, _trace.Layout(1, [root])).paths
        names: dict[int, str] = {}
        for n, e in enumerate(self.info):
            if isinstance(e, LeafInfo):
                names.setdefault(e.slot, paths.get(n, root) or root)
        return [names.get(s, root) for s in range(len(self.leaves))]

    def rebuild(self, slots: Any) -> tuple[Any, list]:
        root, objs = self.sdef.unflatten_nodes(list(slots))
        return root[0], objs

    def step(
        self,
        slots: Any,
        body: Callable[[Any], tuple[Any, Any]],
        extra: tuple[str, Any, str] | None = None,
    ) -> tuple[list, Any]:
        """Run ``body`` (carry -> (new carry, other results)) on the carry rebuilt from
        ``slots``; return the new carry's leaves (in ``slots``' order) and the other results.
        ``extra``: another input of the body (scan's ``xs`` slice), named, with its policy's
        mutations: its in-place changes not returned are an error (``"error"``) or reported
        as discarded (``"discard"``, xs left alone in a call mixing policies)."""
        carry, objs = self.rebuild(slots)
        watched = _snapshot(objs, self.info, self.skip)
        # The caller's carry containers, which the body may reach through a global or a
        # closure (rule 25; a change there would hold a tracer, and the final write-back
        # would replace it).
        callers = _trace.watch_callers(self.objs, objs, self.info, self.skip)
        extra_watch = None
        if extra is not None:
            name, tree, mutations = extra
            if mutations in ("error", "discard"):
                extra_watch = _ExtraWatch(name, tree, mutations)
        new_carry, others = body(carry)
        _trace.check_callers(self.fun, self.objs, callers, self.sdef, objs, self.layout)
        if extra_watch is not None:
            extra_watch.check(self.fun, (new_carry, others))
        new_leaves, new_sdef, new_objs = _native.flatten_shared((new_carry, {}))
        new_info: list[Any] = new_sdef.node_info()
        self._check_structure(carry, new_carry, new_info)

        index = {
            id(objs[k]): k
            for k, e in enumerate(self.info)
            if k not in self.skip and isinstance(e, NodeInfo) and e.node_type is not _NoneType
        }
        kept = set()
        for n, e in enumerate(new_info):
            if n in self.skip or not isinstance(e, NodeInfo) or e.node_type is _NoneType:
                continue
            k = index.get(id(new_objs[n]))
            if k is None:
                continue
            if k != n:
                what = "put the slice's" if self.sliced else "returned the carry's"
                raise ValueError(
                    f"{_qualname(self.fun)} {what} container {self.path(k)} at "
                    f"the place of {self.path(n)}. A loop carries each container at its place; "
                    "build a new object there instead, or keep the container where it is."
                )
            kept.add(n)
        changed = _changed(objs, watched)
        bad = [k for k in changed if k not in kept]
        if not bad:
            self._check_outside_attributes(objs, watched, changed, new_info, new_objs)
        if bad:
            self._raise_unreturned(objs, watched, bad)

        values: dict[int, Any] = {}
        for n, (e_in, e_out) in enumerate(zip(self.info, new_info, strict=True)):
            if isinstance(e_in, LeafInfo):
                s, value = e_in.slot, new_leaves[e_out.slot]
                if s in values and values[s] is not value:
                    raise ValueError(
                        f"{_qualname(self.fun)} gave different values to {self.slot_path(s)} and "
                        f"{self.path(n)}, which are one array in {self.name} (the same object "
                        "at both places). A loop carries that array once; pass two arrays "
                        "(a copy at one of the places) to let them differ."
                    )
                values[s] = value
        new_slots = [values[s] for s in range(len(slots))]
        for s, (old, new) in enumerate(zip(slots, new_slots, strict=True)):
            a, b = _aval(old), _aval(new)
            if not getattr(a, "weak_type", False) and (a.shape, a.dtype) != (b.shape, b.dtype):
                if self.sliced:
                    raise TypeError(
                        f"{_qualname(self.fun)} put a value of type {b.str_short()} at "
                        f"{self.slot_path(s)} of its slice, where xs's rows have type "
                        f"{a.str_short()}: a slice is written back into the stacked xs, row by "
                        "row, so it must keep its shapes and dtypes"
                    )
                raise TypeError(
                    f"{_qualname(self.fun)} returned {self.slot_path(s)} with type "
                    f"{b.str_short()}, but the carry had type {a.str_short()} there: the "
                    "carry's types must be the same at every iteration"
                )
        unchanged = tuple(new is old for old, new in zip(slots, new_slots, strict=True))
        self.pattern = (frozenset(kept), unchanged)
        return new_slots, others

    def _check_outside_attributes(
        self, objs: list, watched: dict, changed: list[int], new_info: list, new_objs: list
    ) -> None:
        """An attribute the body set on a custom node of the carry that the node's flatten
        does not carry cannot reach the caller's object: the ValueError ``jit`` raises."""
        for k in changed:
            e = new_info[k]
            if e.node_type in (list, dict) or not hasattr(objs[k], "__dict__"):
                continue
            new_names = [n for n in vars(objs[k]) if n not in watched[k][0]]
            if not new_names:
                continue
            try:
                after = unflatten_node(e.node_type, e.data, [new_objs[c] for c in e.children])
            except Exception:  # noqa: BLE001 - cannot tell: leave it to the write-back
                continue
            for name in new_names:
                if not hasattr(after, name):
                    _trace.raise_outside_attribute(self.fun, k, name, self.sdef, objs, self.layout)

    def check_untouched(self, fun: Any, slots: Any, run: Callable[[Any], Any]) -> Any:
        """Run ``run`` (while_loop's condition) on the rebuilt carry, which it may not change."""
        carry, objs = self.rebuild(slots)
        watched = _snapshot(objs, self.info, self.skip)
        callers = _trace.watch_callers(self.objs, objs, self.info, self.skip)
        out = run(carry)
        _trace.check_callers(fun, self.objs, callers, self.sdef, objs, self.layout)
        bad = _changed(objs, watched)
        if bad:
            lines = [line for k in bad for line in _describe(self.path(k), objs[k], watched[k])]
            if self.policy.mutations == "error":
                raise _trace.mutation_error(fun, lines, _CONDITION_REMEDY)
            raise ValueError(
                f"{_qualname(fun)}, the loop's condition, changed the carry in place:\n"
                + "\n".join(f"  {line}" for line in lines)
                + "\nA JAX while_loop carries only what the body returns; change the carry in "
                "the body."
            )
        return out

    def _check_structure(self, carry: Any, new_carry: Any, new_info: list) -> None:
        if _same_structure(self.info, new_info, self.unstable):
            return
        if self.sliced:
            raise ValueError(
                f"{_qualname(self.fun)} changed the structure of its slice of xs: "
                f"{_structure_difference(self.name, self.sdef, self.leaves, new_carry)}. Under "
                "policy 'alias' a slice is written back into the stacked xs, so it must keep "
                "xs's structure (keys, list lengths, node types and static data, shared "
                "containers); build a new object to return instead. Nothing was written back."
            )
        raise ValueError(
            f"{_qualname(self.fun)} returned a carry whose structure differs from "
            f"{self.name}'s: {_structure_difference(self.name, self.sdef, self.leaves, new_carry)}"
            ". A loop's carry must keep its structure (keys, list lengths, node types and "
            "static data, shared containers) at every iteration."
        )

    def _raise_unreturned(self, objs: list, watched: dict, bad: list[int]) -> None:
        lines = [line for k in bad for line in _describe(self.path(k), objs[k], watched[k])]
        if self.policy is CLONE:
            # scan's init left alone while xs is not (a policy per argument): the change is
            # lost each iteration, as under jax.lax.scan, and reported as clone reports it.
            _trace.report_discarded(self.fun, lines, None, "'clone' (chosen for init)")
            return
        if self.policy.mutations == "error":
            # Not alias's remedy: under alias this is the ValueError below.
            raise _trace.mutation_error(self.fun, lines, _UNRETURNED_REMEDY)
        if self.sliced:
            raise ValueError(
                f"{_qualname(self.fun)} changed a container of its slice of xs in place, then "
                "put a new object at its place in the slice:\n"
                + "\n".join(f"  {line}" for line in lines)
                + "\nUnder policy 'alias' what the slice holds at the end of the body is "
                "written back into xs, so the change to the replaced container would be lost. "
                "Keep the container (update it in place) or leave it unchanged. Nothing was "
                "written back."
            )
        raise ValueError(
            f"{_qualname(self.fun)} changed the carry in place without returning the changed "
            "container at its place in the carry (it returned a new object there, or none):\n"
            + "\n".join(f"  {line}" for line in lines)
            + "\nIn a Python loop the caller's object would keep the first iteration's change "
            "only, which a JAX loop does not reproduce. Return the same container (update in "
            "place) or leave it unchanged (build a new one). Nothing was written back."
        )

    # -- after the loop ---------------------------------------------------------------------------

    def finish(
        self,
        final_slots: list,
        iterations: int | None = None,
        undo: list[Callable[[], None]] | None = None,
    ) -> Any:
        """The carry the loop returns, built from its final leaves; under ``alias`` the
        containers the body updated in place are the caller's, written with the final state
        (all or nothing). ``iterations``: how many times the loop ran, when known before it
        runs; none is the Python loop that never runs its body, which hands back ``init``.
        ``undo``: when given, the writes' undo steps go there and a failure is left for the
        caller to roll back with them (scan writes the carry and ``xs`` as one)."""
        if self.pattern is None or iterations == 0:
            return self.objs[self.info[self.root].children[0]]
        kept, unchanged = self.pattern
        propagate = self.policy.mutations == "propagate"
        leaves = [
            old if same else new
            for old, new, same in zip(self.leaves, final_slots, unchanged, strict=True)
        ]
        built: list[Any] = [None] * self.sdef.num_nodes
        writes = []
        for n, e in enumerate(self.info):
            if n in self.skip:
                continue
            if isinstance(e, LeafInfo):
                built[n] = leaves[e.slot]
            elif isinstance(e, RefInfo):
                built[n] = built[e.target]
            elif e.node_type is _NoneType:
                built[n] = None
            elif propagate and n in kept:
                built[n] = self.objs[n]
                writes.append(n)
            else:
                built[n] = unflatten_node(e.node_type, e.data, [built[c] for c in e.children])
        steps: list[Callable[[], None]] = [] if undo is None else undo
        try:
            for n in writes:
                step = self._write(n, [built[c] for c in self.info[n].children])
                if step is not None:
                    steps.append(step)
        except BaseException:
            if undo is None:
                _roll_back(steps)
            raise
        return built[self.info[self.root].children[0]]

    def _caller_children(self, n: int) -> list:
        out = []
        for c in self.info[n].children:
            e = self.info[c]
            if isinstance(e, LeafInfo):
                out.append(self.leaves[e.slot])
            elif isinstance(e, RefInfo):
                out.append(self.objs[e.target])
            else:
                out.append(self.objs[c])
        return out

    def _write(self, n: int, children: list) -> Callable[[], None] | None:
        """Give the caller's object at node ``n`` the children ``children``; return the undo."""
        obj, e = self.objs[n], self.info[n]
        if isinstance(obj, tuple):
            return None  # immutable: handed back as it is, so nothing in it changed
        if isinstance(obj, list) and e.node_type is type(obj):
            old = list(obj)
            obj[:] = children

            def undo_list() -> None:
                obj[:] = old

            return undo_list
        rebuilt = unflatten_node(e.node_type, e.data, children)
        if isinstance(obj, dict):
            old_items = list(obj.items())
            for key, value in rebuilt.items():
                if obj[key] is not value:
                    obj[key] = value

            def undo_dict() -> None:
                obj.clear()
                obj.update(old_items)

            if type(obj) in (dict,) or not hasattr(obj, "__dict__"):
                return undo_dict
            undo_attrs = self._write_attributes(n, obj, e, rebuilt)

            def undo_both() -> None:
                undo_attrs()
                undo_dict()

            return undo_both
        return self._write_attributes(n, obj, e, rebuilt)

    def _write_attributes(self, n: int, obj: Any, e: Any, rebuilt: Any) -> Callable[[], None]:
        before = unflatten_node(e.node_type, e.data, self._caller_children(n))
        return write_custom(obj, rebuilt, changed_attributes(before, rebuilt))


def _roll_back(undo: list[Callable[[], None]]) -> None:
    for u in reversed(undo):
        u()


# What strict's MutationError offers instead, where alias would not apply the change.
_UNRETURNED_REMEDY = (
    "Return the changed container at its place in the carry (policy 'alias' then writes the "
    "final state into the caller's object), or build a new object there without changing the "
    "old one; under policy 'alias' this body is a ValueError too, and policy='clone' discards "
    "the change."
)
_CONDITION_REMEDY = (
    "Change the carry in the body: a JAX while_loop carries only what the body returns, so "
    "under policy 'alias' a condition that changes it is a ValueError too, and "
    "policy='clone' discards the change."
)
_SLICE_REMEDY = (
    "Return the changed slice (in the carry or in ys), or use policy='alias', which writes "
    "what the body leaves in each slice back into the stacked xs (row i of each leaf, as "
    "nnx.scan does for what it scans over axis 0), or policy='clone' to discard the change."
)


class _ExtraWatch:
    """Under ``strict``: scan's ``xs`` slice, whose containers the body may not change in place
    unless it returns them."""

    def __init__(self, name: str, tree: Any, mutations: str = "error"):
        self.name, self.mutations = name, mutations
        _, self.sdef, self.objs = _native.flatten_shared((tree, {}))
        info: list[Any] = self.sdef.node_info()
        root = len(info) - 1
        self.snapshot = _snapshot(self.objs, info, {root, info[root].children[1]})

    def check(self, fun: Any, returned: Any) -> None:
        bad = _changed(self.objs, self.snapshot)
        if not bad:
            return
        reached = {id(o) for o in _native.flatten_shared(returned)[2]}
        bad = [k for k in bad if id(self.objs[k]) not in reached]
        if bad:
            paths = _trace.Paths(self.sdef, self.objs, _trace.Layout(1, [self.name])).paths
            lines = [
                line
                for k in bad
                for line in _describe(paths.get(k, "?"), self.objs[k], self.snapshot[k])
            ]
            if self.mutations == "discard":  # xs left alone (a policy per argument)
                _trace.report_discarded(fun, lines, None, "'clone' (chosen for xs)")
                return
            raise _trace.mutation_error(fun, lines, _SLICE_REMEDY)


def _same_structure(a: list, b: list, unstable: set[int]) -> bool:
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
            if k not in unstable and not _trace.same_data(x.data, y.data):
                if not _trace.equal_empty_nodes(x, y):
                    return False
    return True


def _structure_difference(name: str, sdef: Any, leaves: list, new_carry: Any) -> str:
    """Where a body's new carry first differs from the carry, in words."""
    old = sdef.unflatten(leaves)[0]
    try:
        old_paths = [
            jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(old)[0]
        ]
        new_paths = [
            jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_carry)[0]
        ]
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
    new_def = jax.tree_util.tree_structure(new_carry)
    if old_def != new_def:
        return f"{old_def} became {new_def}"
    return "a container shared at two places of the carry became two, or the other way round"


class _Body:
    """The function a JAX loop traces, naming its inputs in jax's messages (a traced value
    used as a bool, ...) as the user's function sees them, ``c['t']`` rather than the carried
    leaves' list (``__fun_debug_info__``, read by jax >= 0.7)."""

    def __init__(
        self,
        run: Callable[..., Any],
        fun: Any,
        traced_for: str,
        names: Callable[[list[str]], list[str]],
    ):
        self.run, self.fun, self.traced_for, self.names = run, fun, traced_for, names
        self.__name__ = getattr(fun, "__name__", "body")

    def __call__(self, *args: Any) -> Any:
        return self.run(*args)

    @property
    def __fun_debug_info__(self) -> Any:
        if DebugInfo is None:
            return None
        try:
            params = [Naming(self.fun).name(i) for i in range(2)]
            return DebugInfo(
                self.traced_for,
                fun_sourceinfo(self.fun),
                tuple(self.names(params)),
                INITIAL_RESULT_PATHS,
            )
        except Exception:  # noqa: BLE001 - naming is best effort; never fail a call over it
            return None


def _tree_names(root: str, tree: Any) -> list[str]:
    return [
        root + jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


class _Entry:
    """The functions a JAX loop traces for one kind of call (the user's functions, the
    carry's structure and types, the loop's options), kept so that JAX finds its cached trace
    again on the next such call instead of tracing and compiling anew. The functions work on
    this thread's current call (``local.state``); ``pattern`` is what their last trace found,
    for the calls that reuse it."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.pattern: Any = None
        self.slices_pattern: Any = None
        self.bodies: tuple = ()

    def state(self) -> _Carry:
        return self.local.state

    def slices(self) -> _Carry:
        """The current call's ``xs`` (scan under alias)."""
        return self.local.slices

    def step(self, *args: Any) -> tuple[list, Any]:
        """The current call's :meth:`_Carry.step`, its pattern kept here as the trace ends:
        another thread may find JAX's cached trace before this call is done."""
        state = self.state()
        out = state.step(*args)
        self.pattern = state.pattern
        return out

    def step_slices(self, *args: Any) -> tuple[list, Any]:
        """:meth:`step` for the current call's ``xs`` slice."""
        slices = self.slices()
        out = slices.step(*args)
        self.slices_pattern = slices.pattern
        return out


_CACHE: OrderedDict[Any, _Entry] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 256


def _entry(key: Any, make: Callable[[_Entry], tuple]) -> _Entry:
    """The cached :class:`_Entry` for ``key`` (made with ``make`` the first time); a fresh one
    when the key cannot be hashed."""
    try:
        hash(key)
    except TypeError:
        key = None
    if key is not None:
        with _CACHE_LOCK:
            entry = _CACHE.get(key)
            if entry is not None:
                _CACHE.move_to_end(key)
                return entry
    entry = _Entry()
    entry.bodies = make(entry)
    if key is not None:
        with _CACHE_LOCK:
            entry = _CACHE.setdefault(key, entry)
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return entry


def _run(
    entry: _Entry, state: _Carry, loop: Callable[..., Any], slices: _Carry | None = None
) -> Any:
    """Run ``loop(*entry.bodies)`` for ``state``'s call (and ``slices``, scan's ``xs`` under
    alias); afterwards ``state.pattern`` is what the body's trace found, this call's or (JAX
    reused a trace) the last one's, and so is ``slices.pattern``."""
    saved = getattr(entry.local, "state", None), getattr(entry.local, "slices", None)
    entry.local.state, entry.local.slices = state, slices
    try:
        out = loop(*entry.bodies)
    finally:
        entry.local.state, entry.local.slices = saved
    if state.pattern is None:  # JAX reused a trace: what it found
        state.pattern = entry.pattern
    if slices is not None and slices.pattern is None:
        slices.pattern = entry.slices_pattern
    return out


def _key_of(tree: Any) -> Any:
    """A tree's structure and leaf types, as part of a cache key (None: not one)."""
    try:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return treedef, tuple(_aval(x) for x in leaves)
    except Exception:  # noqa: BLE001 - not a key: JAX will say what is wrong with it
        return None


def _count(lower: Any, upper: Any) -> int | None:
    """How many times ``for i in range(lower, upper)`` runs, when the bounds are concrete."""
    try:
        return max(int(upper) - int(lower), 0)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


# --- the loops -----------------------------------------------------------------------------------


def scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    _split_transpose: bool = False,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> tuple[Carry, Y]:
    """``jax.lax.scan(f, init, xs, length, reverse, unroll)`` with a policy.

    Under ``clone`` the call is ``jax.lax.scan``'s own. Under ``alias`` it is the Python loop
    ``for x in slices(xs): carry, y = f(carry, x)`` on the caller's ``init``: the body may
    update the carry in place and return it, and the carry returned is then the caller's same
    object holding the final state. Each slice ``x`` is a view of row i of each leaf of
    ``xs``: what the body does to it in place (a counter, a BatchNorm's statistics in a stack
    of layers) is written back into the caller's ``xs`` as a new stacked array per changed
    leaf, as ``nnx.scan`` does for a module scanned over axis 0. ``ys`` are stacked as by
    ``jax.lax.scan``. Under ``strict`` a carry container (or slice) changed in place and not
    returned is a :class:`~treeclone.MutationError`, and nothing is written back.

    >>> import jax.numpy as jnp, treeclone
    >>> def body(state, x):
    ...     state["total"] = state["total"] + x  # in place
    ...     return state, 2 * x
    >>> state = {"total": jnp.zeros(())}
    >>> carry, ys = treeclone.scan(body, state, jnp.arange(4.0), policy="alias")
    >>> carry is state, state, ys
    (True, {'total': Array(6., dtype=float32)}, Array([0., 2., 4., 6.], dtype=float32))
    """
    chosen, xs_policy = _policies_of(policy, "scan")
    mixed = chosen is not xs_policy
    extra = {"_split_transpose": True} if _split_transpose else {}
    if chosen is CLONE and not mixed:
        _check_cycle(init, "init")
        _check_cycle(xs, "xs")
        return jax.lax.scan(reporting(f), init, xs, length, reverse, unroll, **extra)
    state = _Carry(f, init, "init", chosen)
    if xs is not None and xs_policy.mutations == "propagate":
        slices = _Carry(f, xs, "xs", xs_policy, sliced=True)
        if mixed:
            _check_shared(f, state, slices.objs, slices.info, slices.path, xs_policy)
        return _scan_alias(f, state, slices, length, reverse, unroll, extra)
    _check_cycle(xs, "xs")
    if mixed:
        _, xs_def, xs_objs = _native.flatten_shared((xs, {}))
        xs_paths = _trace.Paths(xs_def, xs_objs, _trace.Layout(1, ["xs"])).paths
        xs_info = xs_def.node_info()
        _check_shared(f, state, xs_objs, xs_info, lambda n: xs_paths.get(n) or "xs", xs_policy)
    # What the body does to its slice of xs in place and does not return: strict's error, or
    # (xs left alone in a call mixing policies) clone's report.
    xs_mode = "error" if xs_policy.mutations == "error" else "discard" if mixed else "off"
    xs_key = _key_of(xs)

    def make(entry: _Entry) -> tuple:
        xs_paths = [] if xs_key is None else xs_key[0].unflatten([0] * len(xs_key[1]))

        def body(slots: list, x: Any) -> tuple[list, Any]:
            return entry.step(slots, lambda carry: _pair(f, f(carry, x)), ("xs", x, xs_mode))

        def names(p: list[str]) -> list[str]:  # a slice's key paths are xs's
            return entry.state().slot_names(p[0]) + _tree_names(p[1], xs_paths)

        return (_Body(body, f, "scan", names),)

    key: Any = None
    if xs_key is not None:
        options = (length, reverse, unroll, _split_transpose)
        key = ("scan", f, state.sdef, chosen, xs_policy, state.avals, xs_key, options)
    entry = _entry(key, make)
    final, ys = _run(
        entry,
        state,
        lambda body: jax.lax.scan(body, state.leaves, xs, length, reverse, unroll, **extra),
    )
    if length is None:
        length = next((len(x) for x in jax.tree_util.tree_leaves(xs)), None)
    return state.finish(list(final), length), ys


def _check_shared(
    f: Any, state: _Carry, xs_objs: list, xs_info: list, xs_path: Callable[[int], str], xs: Policy
) -> None:
    """A container in both ``init`` and ``xs``, given different policies (``xs``: xs's), has
    no single answer (written back for one, left alone for the other): the ValueError jit
    raises, naming both key paths (docs/semantics.md, rule 39)."""
    where = {
        id(state.objs[k]): k
        for k, e in enumerate(state.info)
        if k not in state.skip and isinstance(e, NodeInfo) and e.node_type is not _NoneType
    }
    root = len(xs_info) - 1
    skip = {root, xs_info[root].children[-1]}
    for n, e in enumerate(xs_info):
        if n in skip or not isinstance(e, NodeInfo) or e.node_type is _NoneType:
            continue
        k = where.get(id(xs_objs[n]))
        if k is not None:
            raise ValueError(
                f"{_qualname(f)}: the {type(xs_objs[n]).__name__} at {state.path(k)} (policy "
                f"{_name(state.policy)}) is also at {xs_path(n)} (policy {_name(xs)}): one "
                "container cannot be both written back and left alone. Pass it through one "
                "argument, or give both arguments one policy."
            )


def _name(policy: Policy) -> str:
    return repr(policy.name) if policy.name is not None else repr(policy)


def _pair(f: Any, out: Any) -> tuple[Any, Any]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"{_qualname(f)}, the body of scan, must return a pair (carry, y), got "
            f"{type(out).__name__}"
        )
    return out[0], out[1]


def _scan_alias(
    f: Callable[..., Any],
    state: _Carry,
    slices: _Carry,
    length: int | None,
    reverse: bool,
    unroll: int | bool,
    extra: dict[str, Any],
) -> tuple[Any, Any]:
    """``scan`` under ``alias`` with ``xs``: each slice is a view of row i of the stacked
    ``xs`` (rule L7). The JAX loop scans over ``xs``'s distinct leaves; its body rebuilds the
    slice from their rows, and besides ``ys`` emits, stacked, the final row of each ``xs``
    leaf the body changed (found by the trace, the same at every iteration, as nnx.scan's
    output of a module's state). Those become the caller's leaves after the loop, written as
    the carry's are, the two all or nothing; a leaf never changed stays the caller's array."""

    def make(entry: _Entry) -> tuple:
        def body(slots: list, x_slots: list) -> tuple[list, Any]:
            def run(carry: Any) -> tuple[Any, Any]:
                def run_x(x: Any) -> tuple[Any, Any]:
                    return x, _pair(f, f(carry, x))  # the slice as the body leaves it

                new_x, (new_carry, y) = entry.step_slices(x_slots, run_x)
                return new_carry, (y, new_x)

            new_slots, (y, new_x) = entry.step(slots, run)
            unchanged = entry.slices().pattern[1]  # type: ignore[index]
            return new_slots, (y, [v for v, same in zip(new_x, unchanged, strict=True) if not same])

        def names(p: list[str]) -> list[str]:
            return entry.state().slot_names(p[0]) + entry.slices().slot_names(p[1])

        return (_Body(body, f, "scan", names),)

    options = (length, reverse, unroll, bool(extra))
    policies = (state.policy, slices.policy)
    key = ("scan", f, state.sdef, policies, state.avals, slices.sdef, slices.avals, options)
    entry = _entry(key, make)
    final, (ys, rows) = _run(
        entry,
        state,
        lambda body: jax.lax.scan(
            body, state.leaves, slices.leaves, length, reverse, unroll, **extra
        ),
        slices,
    )
    if length is None:
        length = next((len(x) for x in slices.leaves), None)
    final_xs = list(slices.leaves)
    assert slices.pattern is not None
    changed = [s for s, same in enumerate(slices.pattern[1]) if not same]
    for s, stacked in zip(changed, rows, strict=True):
        final_xs[s] = stacked
    undo: list[Callable[[], None]] = []
    try:
        carry = state.finish(list(final), length, undo)
        slices.finish(final_xs, length, undo)
    except BaseException:
        _roll_back(undo)
        raise
    return carry, ys


def fori_loop(
    lower: Any,
    upper: Any,
    body_fun: Callable[[Any, Carry], Carry],
    init_val: Carry,
    *,
    unroll: int | bool | None = None,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Carry:
    """``jax.lax.fori_loop(lower, upper, body_fun, init_val, unroll=unroll)`` with a policy.

    Under ``alias`` the call is ``for i in range(lower, upper): val = body_fun(i, val)`` on the
    caller's ``init_val`` (see :func:`scan` for the carry's rules).

    >>> import jax.numpy as jnp, treeclone
    >>> def body(i, acc):
    ...     acc.append(acc.pop() + i)  # a list updated in place
    ...     return acc
    >>> acc = [jnp.zeros((), jnp.int32)]
    >>> treeclone.fori_loop(0, 5, body, acc, policy="alias") is acc, acc
    (True, [Array(10, dtype=int32)])
    """
    chosen = _policy_of(policy, "fori_loop")
    if chosen is CLONE:
        _check_cycle(init_val, "init_val")
        return jax.lax.fori_loop(lower, upper, reporting(body_fun), init_val, unroll=unroll)
    state = _Carry(body_fun, init_val, "init_val", chosen)

    def make(entry: _Entry) -> tuple:
        def body(i: Any, slots: list) -> list:
            return entry.step(slots, lambda carry: (body_fun(i, carry), None))[0]

        def names(p: list[str]) -> list[str]:
            return [p[0], *entry.state().slot_names(p[1])]

        return (_Body(body, body_fun, "fori_loop", names),)

    bounds = _key_of((lower, upper))
    kinds = (type(lower), type(upper), unroll)
    key = ("fori_loop", body_fun, state.sdef, chosen, state.avals, bounds, kinds)
    final = _run(
        _entry(None if bounds is None else key, make),
        state,
        lambda body: jax.lax.fori_loop(lower, upper, body, state.leaves, unroll=unroll),
    )
    return state.finish(list(final), _count(lower, upper))


def while_loop(
    cond_fun: Callable[[Carry], Any],
    body_fun: Callable[[Carry], Carry],
    init_val: Carry,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Carry:
    """``jax.lax.while_loop(cond_fun, body_fun, init_val)`` with a policy.

    Under ``alias`` the call is ``while cond_fun(val): val = body_fun(val)`` on the caller's
    ``init_val`` (see :func:`scan` for the carry's rules); ``cond_fun`` may not change the
    carry in place (an error: JAX's loop carries only what the body returns).

    >>> import jax.numpy as jnp, treeclone
    >>> def body(state):
    ...     state["n"] = state["n"] * 2
    ...     return state
    >>> state = {"n": jnp.ones((), jnp.int32)}
    >>> out = treeclone.while_loop(lambda s: s["n"] < 100, body, state, policy="alias")
    >>> out is state, state
    (True, {'n': Array(128, dtype=int32)})
    """
    chosen = _policy_of(policy, "while_loop")
    if chosen is CLONE:
        _check_cycle(init_val, "init_val")
        return jax.lax.while_loop(reporting(cond_fun), reporting(body_fun), init_val)
    state = _Carry(body_fun, init_val, "init_val", chosen)

    def make(entry: _Entry) -> tuple:
        def cond(slots: list) -> Any:
            return entry.state().check_untouched(cond_fun, slots, cond_fun)

        def body(slots: list) -> list:
            return entry.step(slots, lambda carry: (body_fun(carry), None))[0]

        def names(p: list[str]) -> list[str]:
            return entry.state().slot_names(p[0])

        return (
            _Body(cond, cond_fun, "while_cond", names),
            _Body(body, body_fun, "while_body", names),
        )

    key = ("while_loop", cond_fun, body_fun, state.sdef, chosen, state.avals)
    final = _run(
        _entry(key, make),
        state,
        lambda cond, body: jax.lax.while_loop(cond, body, state.leaves),
    )
    return state.finish(list(final))
