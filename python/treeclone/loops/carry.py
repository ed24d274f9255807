"""One call of ``treeclone.scan``, ``fori_loop`` or ``while_loop`` through the lift, with the
loop's own rules: the one place to change how a loop lifts its carry.

The loop's inputs (the carry, with scan's ``xs`` when it is written back: one call ``(init,
xs)``) are flattened with identity by :func:`flatten_call` (:class:`LoopCall`). At each
iteration, traced once, the body runs through the trace's steps (:func:`begin`, then
``call``, ``diff``, ``plan``) on the call rebuilt from the JAX loop's leaves; that records the
call's native ``CallPlan``, the write-back every transformation uses. Between ``call`` and
``diff`` the loop's rules are checked here, at trace time, before the trace's own: the
carry (and the slice) keeps its structure and types, and each container is the input
container at its place (updated in place) or a new one (the input container then unchanged).
So the plan, the same at every iteration, applied once to the final leaves after the loop,
writes the caller's objects, all or nothing. ``loop.py`` runs the JAX loops over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from treeclone import _effects
from treeclone._docs import see
from treeclone._effects import qualname
from treeclone._jax_compat import unflatten_node
from treeclone._lift import Naming, begin, flatten_call
from treeclone._native import EntryInfo
from treeclone.loops.rules import (
    CONDITION_REMEDY,
    NAMINGS,
    UNRETURNED_REMEDY,
    changed,
    containers,
    not_a_jax_type,
    same_structure,
    shallow_changes,
    snapshot,
    split_static,
    stand_in,
    structure_difference,
)

__all__ = ["LoopCall", "LoopPlan"]

NodeInfo = EntryInfo.Node
LeafInfo = EntryInfo.Leaf
RefInfo = EntryInfo.Ref


_aval = jax.api_util.shaped_abstractify


# --- one loop call -------------------------------------------------------------------------------


class LoopPlan:
    """What the body's trace found, the same at every iteration: the ``CallPlan`` that writes
    the final state (``plan``), where each of its outputs is among the final leaves and the
    call's own (``gather``: an index into ``final + call.leaves``), and the ``xs`` leaves the
    body changed, whose rows scan stacks (``stacked``, slots of the call)."""

    __slots__ = ("gather", "plan", "stacked")

    def __init__(self, plan: Any, gather: tuple[int, ...], stacked: tuple[int, ...]):
        self.plan, self.gather, self.stacked = plan, gather, stacked


class LoopCall:
    """One loop call under a policy other than ``clone``: its inputs flattened with identity by
    the lift as one call (``call``: ``(init,)``, or scan's ``(init, xs)`` when ``xs`` is
    written back), the slots the JAX loop carries (``carried``) and scans over (``scanned``).
    ``fun``: the user's body (for messages); ``policy``: the lift's; ``policies``: each
    argument's; ``traced``: the ``traced=`` rule (resolved): the leaves it rejects
    (``call.static``) are the loop's constants, as ``eqx.partition``'s static part closed
    over a JAX loop: the JAX loop carries None in their place, and the body must leave each
    as it is (an equal value, of the same type) at every iteration."""

    def __init__(
        self,
        api: str,
        fun: Any,
        args: tuple,
        policy: Any,
        policies: tuple,
        traced: Callable[[Any], bool] | None = None,
    ):
        self.fun, self.policy, self.policies = fun, policy, policies[: len(args)]
        self.naming, self.traced = NAMINGS[api], traced
        # An unhashable static leaf is accepted (hashed=False), as eqx.partition's static part
        # closed over a JAX loop: such a call is keyed on nothing (``loops._entry``).
        self.call = flatten_call(self.naming, args, {}, traced=traced, hashed=False)
        static = self.call.static
        self.static: frozenset[int] = frozenset() if static is None else static.slots
        self.names = [self.naming.name(i) for i in range(len(args))]
        self.layout = _effects.Layout(len(args), self.names)
        self.info: list[Any] = self.call.sdef.node_info()
        self.tops: list[int] = self.info[-1].children[: len(args)]
        self.skip = {len(self.info) - 1, self.info[-1].children[-1]}
        self.unstable = _effects.unstable_static_data((*args, {}), self.info)
        arg_slots = self.call.arg_slots()
        self.carried, self.scanned = arg_slots[0], arg_slots[1] if len(args) > 1 else []
        self.record: LoopPlan | None = None  # this call's trace, when JAX did not reuse one
        self._paths: dict[int, str] | None = None
        # An array in both init and xs: one slot cannot be both carried and scanned (scan
        # then leaves xs out of the call; see ``SliceWatch``).
        self.shared = set(self.carried) & set(self.scanned) - self.static
        self._check_leaves()

    def _check_leaves(self) -> None:
        scanned = set(self.scanned)
        avals: list[Any] = []
        for s, leaf in enumerate(self.call.leaves):
            if s in self.static:
                avals.append(None)  # the key has it: ``call.static``
                continue
            try:
                avals.append(_aval(leaf))
            except TypeError:
                where, verb = self.slot_path(s), "scanned" if s in scanned else "carried"
                raise TypeError(not_a_jax_type(where, leaf, verb, self.traced)) from None
        self.avals = tuple(avals)

    def path(self, n: int) -> str:
        if self._paths is None:
            self._paths = _effects.Paths(self.call.sdef, self.call.objects, self.layout).paths
        return self._paths.get(n, "?") or self.names[0]

    def slot_path(self, s: int) -> str:
        for n, e in enumerate(self.info):
            if isinstance(e, LeafInfo) and e.slot == s:
                return self.path(n)
        return f"{self.names[0]}<leaf {s}>"

    def argument(self, n: int) -> int:
        """Which argument (0: the carry, 1: scan's xs) node ``n`` is in."""
        for a, top in enumerate(self.tops):
            e = self.info[top]
            if top - (e.size if isinstance(e, NodeInfo) else 1) < n <= top:
                return a
        return 0

    def debug_names(self, params: list[str]) -> list[str]:
        """Each carried (then scanned) leaf's key path, the arguments named ``params``."""
        names = self.call.slot_names(Naming(stand_in("body", tuple(params))))
        return [names[s] for s in (*self.carried, *self.scanned) if s not in self.static]

    # -- at trace time, in the JAX loop's body ----------------------------------------------------

    def step(self, carry: list, rows: list, body: Callable[..., tuple], watch: Any = None) -> tuple:
        """Run ``body`` (the call's arguments -> (their new values, other results)) under the
        lift on the call rebuilt from the JAX loop's ``carry`` (and ``rows``, scan's slices of
        ``xs``). Returns the carry's new leaves, the other results and the new rows of the
        ``xs`` leaves the body changes; records the plan (``record``). ``watch``: scan's slice
        of an ``xs`` not written back, whose unreturned changes it checks."""
        in_leaves = self._in_leaves(carry, rows)
        found: dict[str, Any] = {}

        def lifted(*args: Any) -> Any:
            found["new"], found["others"] = body(*args)
            return found["new"] if len(args) > 1 else found["new"][0]

        lifted.__qualname__ = qualname(self.fun)  # the trace's messages name the body
        lifted.__module__ = getattr(self.fun, "__module__", None)  # type: ignore[assignment]
        lifted.__wrapped__ = self.fun  # type: ignore[attr-defined]
        sdef = self.call.sdef
        prepared = begin(lifted, self.policy, self.naming, sdef, in_leaves, None)
        objs = prepared.objs
        watched = snapshot(objs, self.info, self.skip)
        # The caller's containers, which the body may reach through a global or a closure
        # (rule J30; checked first, as it puts them back).
        callers = _effects.watch_callers(self.call.objects, objs, self.info, self.skip)
        called = prepared.call()
        _effects.check_callers(self.fun, self.call.objects, callers, sdef, objs, self.layout)
        # A carry container the body consumed (equinox's State once set) and replaced by its
        # successor: a new object at its place, the input as it was (rule L3).
        index = {id(objs[k]): k for k in containers(self.info, self.skip)}
        _effects.take_successors(prepared, found["new"], index, before=watched)
        if watch is not None:
            watch.check(self.fun, (found["new"], found["others"]))
        kept_static: dict[int, int] = {}  # the body's static leaf (by id) -> the slot it keeps
        new_slots = self._check(in_leaves, objs, watched, found["new"], kept_static)
        diffed = called.diff()
        plan = diffed.plan(forced=_forced(diffed, in_leaves, new_slots))
        where = {id(v): len(new_slots) + s for s, v in enumerate(in_leaves)}
        where.update({id(v): s for s, v in reversed(list(enumerate(new_slots)))})
        where.update({k: len(new_slots) + s for k, s in kept_static.items()})
        stacked = tuple(s for s in self.scanned if new_slots[s] is not in_leaves[s])
        # An output found in neither is a new value in a container of an argument left alone
        # (policy clone in a call mixing policies): built fresh and dropped, any value will do.
        self.record = LoopPlan(plan.plan, tuple(where.get(id(o), 0) for o in plan.outputs), stacked)
        new_rows = [new_slots[s] for s in stacked]
        others = found["others"]
        if self.traced is not None and others is not None:
            others = split_static(others, self.traced)
        return self.inputs_of(new_slots, self.carried), others, new_rows

    def _in_leaves(self, carry: Any, rows: Any) -> list:
        """The call's leaves rebuilt from the JAX loop's ``carry`` and ``rows`` (scan's
        slices of ``xs``), the static ones (``traced=``) back in their slots."""
        in_leaves: list = [None] * len(self.call.leaves)
        for s, leaf in zip((*self.carried, *self.scanned), (*carry, *rows), strict=True):
            in_leaves[s] = leaf
        for s in self.static:
            in_leaves[s] = self.call.leaves[s]
        return in_leaves

    def inputs_of(self, values: list, slots: list[int]) -> list:
        """``values`` (one per slot) of ``slots``, as the JAX loop carries them: None for a
        static one."""
        return [None if s in self.static else values[s] for s in slots]

    def _check(
        self, in_leaves: list, objs: list, watched: dict, new: tuple, kept_static: dict
    ) -> list:
        """The loop's rules for what the body returns (``new``, one per argument): it keeps
        the structure and types of the call, and each container is the input container at the
        same place (updated in place) or a new one (the input one unchanged). Returns the new
        value of each slot (see :meth:`_new_slots` for ``kept_static``)."""
        after = flatten_call(self.naming, new, {})
        new_info: list[Any] = after.sdef.node_info()
        if not same_structure(self.info, new_info, self.unstable):
            self._raise_structure(new)
        index = {id(objs[k]): k for k in containers(self.info, self.skip)}
        kept = set()
        for n in containers(new_info, self.skip):
            k = index.get(id(after.objects[n]))
            if k is not None and k != n:
                what = "put the slice's" if self.argument(n) else "returned the carry's"
                raise ValueError(
                    see(
                        "loop-carry",
                        f"{qualname(self.fun)} {what} container {self.path(k)} at "
                        f"the place of {self.path(n)}. A loop carries each container at its place; "
                        "build a new object there instead, or keep the container where it is.",
                    )
                )
            if k is not None:
                kept.add(n)
        touched = changed(objs, watched)
        bad = [k for k in touched if k not in kept]
        if bad:
            self._raise_unreturned(objs, watched, bad)
        else:
            self._check_outside_attributes(objs, watched, touched, new_info, after.objects)
        return self._new_slots(new_info, after.leaves, in_leaves, kept_static)

    def _new_slots(
        self, new_info: list, new_leaves: list, in_leaves: list, kept_static: dict
    ) -> list:
        """Each slot's new value (the body's leaf at its place), checked: one array of the
        call stays one, and keeps its shape and dtype; a static leaf (``traced=``) stays equal
        and is the call's own (the body's equal object is put in ``kept_static``: its id ->
        the slot)."""
        values: dict[int, Any] = {}
        for n, (e_in, e_out) in enumerate(zip(self.info, new_info, strict=True)):
            if isinstance(e_in, LeafInfo):
                s, value = e_in.slot, new_leaves[e_out.slot]
                if s in values and values[s] is not value:
                    raise ValueError(
                        see(
                            "loop-carry",
                            f"{qualname(self.fun)} gave different values to {self.slot_path(s)} "
                            f"and {self.path(n)}, which are one array in {self.names[0]} (the same "
                            "object at both places). A loop carries that array once; pass two "
                            "arrays (a copy at one of the places) to let them differ.",
                        )
                    )
                values[s] = value
        for s in self.static:
            value = values[s]
            if value is not in_leaves[s]:
                self._check_static(s, in_leaves[s], value)
                kept_static[id(value)] = s
                values[s] = in_leaves[s]
        new_slots = [values[s] for s in range(len(self.call.leaves))]
        scanned = set(self.scanned)
        for s, (old, new) in enumerate(zip(in_leaves, new_slots, strict=True)):
            if s in self.static:
                continue
            a, b = _aval(old), _aval(new)
            if not getattr(a, "weak_type", False) and (a.shape, a.dtype) != (b.shape, b.dtype):
                if s in scanned:
                    raise TypeError(
                        see(
                            "loop-slice",
                            f"{qualname(self.fun)} put a value of type {b.str_short()} at "
                            f"{self.slot_path(s)} of its slice, where xs's rows have type "
                            f"{a.str_short()}: a slice is written back into the stacked xs, row "
                            "by row, so it must keep its shapes and dtypes",
                        )
                    )
                raise TypeError(
                    see(
                        "loop-carry",
                        f"{qualname(self.fun)} returned {self.slot_path(s)} with type "
                        f"{b.str_short()}, but the carry had type {a.str_short()} there: the "
                        "carry's types must be the same at every iteration",
                    )
                )
        return new_slots

    def _check_static(self, s: int, old: Any, new: Any) -> None:
        """A static leaf of the call (``traced=``) that the body changed: a ValueError naming
        its key path (a JAX loop's constants are the same at every iteration)."""
        if not _effects.same_static(old, new):
            raise ValueError(
                see(
                    "loop-carry",
                    f"{qualname(self.fun)} changed {self.slot_path(s)} from {old!r} to {new!r}: a "
                    "leaf that traced= leaves static is a constant of the loop, the same at every "
                    "iteration (as eqx.partition's static part closed over a JAX loop). Make it an "
                    "array (traced), or keep it and return another value apart from the carry.",
                )
            )

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
                    sdef = self.call.sdef
                    _effects.raise_outside_attribute(self.fun, k, name, sdef, objs, self.layout)

    def check_untouched(self, fun: Any, slots: Any) -> Any:
        """Run ``fun`` (while_loop's condition) on the carry rebuilt from ``slots``, which it
        may not change."""
        root, objs = self.call.sdef.unflatten_nodes(self._in_leaves(slots, []))
        watched = snapshot(objs, self.info, self.skip)
        callers = _effects.watch_callers(self.call.objects, objs, self.info, self.skip)
        out = fun(root[0])
        _effects.check_callers(fun, self.call.objects, callers, self.call.sdef, objs, self.layout)
        bad = changed(objs, watched)
        if bad:
            lines = [x for k in bad for x in shallow_changes(self.path(k), objs[k], watched[k])]
            if self.policies[0].mutations == "error":
                raise _effects.mutation_error(fun, lines, CONDITION_REMEDY)
            if self.policies[0].mutations == "discard":  # clone (with traced=): reported
                _effects.report_discarded(fun, lines, None, "'clone'")
                return out
            raise ValueError(
                see(
                    "loop-carry",
                    f"{qualname(fun)}, the loop's condition, changed the carry in place:\n"
                    + "\n".join(f"  {line}" for line in lines)
                    + "\nA JAX while_loop carries only what the body returns; change the carry in "
                    "the body.",
                )
            )
        return out

    def _raise_structure(self, new: tuple) -> None:
        # The slice first: the body's slice of xs is checked before the carry it returns.
        for a in reversed(range(len(new))):
            found = structure_difference(self.names[a], self.call.args[a], new[a])
            if a and found is not None:
                raise ValueError(
                    see(
                        "loop-slice",
                        f"{qualname(self.fun)} changed the structure of its slice of xs: {found}. "
                        "Under policy 'alias' a slice is written back into the stacked xs, so it "
                        "must keep xs's structure (keys, list lengths, node types and static data, "
                        "shared containers); build a new object to return instead. Nothing was "
                        "written back.",
                    )
                )
            if not a:
                found = found or (
                    "a container shared at two places of the carry became two, or the other "
                    "way round"
                )
                raise ValueError(
                    see(
                        "loop-carry",
                        f"{qualname(self.fun)} returned a carry whose structure differs from "
                        f"{self.names[0]}'s: {found}. A loop's carry must keep its structure "
                        "(keys, list lengths, node types and static data, shared containers) at "
                        "every iteration.",
                    )
                )

    def _raise_unreturned(self, objs: list, watched: dict, bad: list[int]) -> None:
        """The error for containers changed in place and not handed back at their place:
        the slice's first (it is checked before the carry), each by its argument's policy."""
        for a in sorted({self.argument(k) for k in bad}, reverse=True):
            mine = [k for k in bad if self.argument(k) == a]
            lines = [x for k in mine for x in shallow_changes(self.path(k), objs[k], watched[k])]
            policy = self.policies[a]
            if policy.mutations == "discard":
                continue  # init left alone while xs is not: the lift reports the lost change
            if policy.mutations == "error":
                # Not alias's remedy: under alias this is the ValueError below.
                raise _effects.mutation_error(self.fun, lines, UNRETURNED_REMEDY)
            if a:
                raise ValueError(
                    see(
                        "loop-slice",
                        f"{qualname(self.fun)} changed a container of its slice of xs in place, "
                        "then put a new object at its place in the slice:\n"
                        + "\n".join(f"  {line}" for line in lines)
                        + "\nUnder policy 'alias' what the slice holds at the end of the body is "
                        "written back into xs, so the change to the replaced container would be "
                        "lost. Keep the container (update it in place) or leave it unchanged. "
                        "Nothing was written back.",
                    )
                )
            raise ValueError(
                see(
                    "loop-carry",
                    f"{qualname(self.fun)} changed the carry in place without returning the "
                    "changed container at its place in the carry (it returned a new object there, "
                    "or none):\n"
                    + "\n".join(f"  {line}" for line in lines)
                    + "\nIn a Python loop the caller's object would keep the first iteration's "
                    "change only, which a JAX loop does not reproduce. Return the same container "
                    "(update in place) or leave it unchanged (build a new one). Nothing was "
                    "written back.",
                )
            )

    # -- after the loop ---------------------------------------------------------------------------

    def finish(self, record: LoopPlan, carry: list, rows: list, iterations: int | None) -> Any:
        """The carry the loop returns, by the plan from its final leaves (``carry``, and the
        stacked ``rows`` of the ``xs`` leaves the body changes): under ``alias`` written into
        the caller's objects, all or nothing. ``iterations``: how many times the loop ran,
        when known before it runs; none is the Python loop that never runs its body, which
        hands back ``init``."""
        leaves = self.call.leaves
        if iterations == 0:
            return self.call.args[0]
        final = list(leaves)
        for s, value in zip((*self.carried, *record.stacked), (*carry, *rows), strict=True):
            if s not in self.static:
                final[s] = value
        pool = final + leaves
        out = record.plan.apply(leaves, self.call.objects, [pool[g] for g in record.gather])
        return out if len(self.call.args) == 1 else out[0]


def _forced(diffed: _effects.Diffed, in_leaves: list, new_slots: list) -> list[bool]:
    """Which result leaves the loop's plan takes from the computation's outputs. The plan is
    applied once, after the loop, to the final leaves, so an input leaf (a tracer the body was
    given) in the result is the caller's own leaf only if the body hands it back at its own
    place at each iteration; else it is an output, the final leaf at its place. A caller's
    container the body does not hand back (it built a new one in its place) keeps the caller's
    leaves: written by no plan, it loses its origin where it holds such an output. (The rest of
    what the body does not hand back keeps its input leaves: the caller's, unchanged.)"""
    moving = {id(v) for v, new in zip(in_leaves, new_slots, strict=True) if new is not v}
    rdef, rleaves, origins = diffed.result_def, diffed.result_leaves, diffed.origins
    if diffed.result_child is None:  # nothing is written: the result is the body's alone
        return [id(leaf) in moving for leaf in rleaves]
    info = rdef.node_info()
    returned = _reachable(info, info[-1].children[diffed.result_child])
    handed_back = {e.slot for n in returned if isinstance(e := info[n], LeafInfo)}
    forced = [s in handed_back and id(x) in moving for s, x in enumerate(rleaves)]
    if any(forced):
        for n, origin in enumerate(origins):
            if origin is not None and n not in returned:
                if any(forced[s] for slots in rdef.child_slots(n) for s in slots):
                    origins[n] = None
    return forced


def _reachable(info: list, top: int) -> set[int]:
    """The entries of the subtree at ``top``, with those its references lead to."""
    seen: set[int] = set()
    agenda = [top]
    while agenda:
        n = agenda.pop()
        size = info[n].size if isinstance(info[n], NodeInfo) else 1
        for m in set(range(n - size + 1, n + 1)) - seen:
            seen.add(m)
            if isinstance(info[m], RefInfo):
                agenda.append(info[m].target)
    return seen
