"""Inputs the function consumed: a container that flattened before the call and refuses to
after it. Equinox's ``State`` does this by design: ``state.set(index, value)`` (and
``update``) returns a new State, its successor, and leaves the old one unreadable ("Attempted
to use old state"), so that a step cannot use an old state by mistake.

The rule, in one place (:func:`take_successors`, called by ``Called.diff`` when the inputs
cannot be flattened after the call): a consumed input takes the contents of its successor,
the one new object of its type and structure (the same node data: a State's keys) found in
the inputs or the result after the call. So under ``alias`` the caller's State ends up
holding what the returned State holds (the change reaches the caller's object, as every
in-place change does); under ``strict`` and ``clone`` nothing is written and the caller keeps
its State as it was, as under ``eqx.filter_jit``; a successor the result holds counts as
returning the consumed input (``strict`` accepts it). Without one successor: ``clone`` takes
the input as it was (``jax.jit`` accepts the step: its copy was consumed), ``strict`` raises
its ``MutationError`` (the change is not returned) and ``alias`` a ``ValueError`` (the change
cannot reach the caller's object), each naming the key path.

A loop carries a new object at the place of a consumed carry container (``before``: the
carry's shallow state before the body ran): the consumed input is then put back as it was
(rule L3: the body built a new object there, and the input is unchanged), as
``eqx.partition`` around ``jax.lax.scan`` leaves the caller's State.
"""

from __future__ import annotations

from typing import Any

import jax

from treeclone import _native
from treeclone._docs import see
from treeclone._effects.messages import qualname, raise_mutation_error
from treeclone._effects.tree import Paths, same_data
from treeclone._effects.watch import restore_shallow_state
from treeclone._jax_compat import unflatten_node
from treeclone._writeback import write_custom

_PLAIN = (list, dict, tuple, type(None))


def _node_data(x: Any) -> Any:
    """The node data of ``x``'s own pytree node (``_MISSING``: it cannot be flattened)."""
    try:
        entry: Any = _native.flatten_shared(x)[1].node_info()[-1]
    except Exception:  # noqa: BLE001 - consumed too: not a successor
        return _MISSING
    return getattr(entry, "data", _MISSING)


_MISSING: Any = object()


def _flattens(obj: Any) -> bool:
    """Whether ``obj``'s own node still flattens (one level: its children are not asked)."""
    try:
        jax.tree_util.tree_flatten(obj, is_leaf=lambda x: x is not obj)
    except Exception:  # noqa: BLE001 - whatever the node's flatten raises: consumed
        return False
    return True


def take_successors(
    p: Any, out: Any, container_index: dict[int, int], before: dict[int, tuple] | None = None
) -> set[int] | None:
    """Give each input container of ``p`` (the trace's ``Prepared``: ``objs``, ``info``,
    ``root``, ``policy_of``, ``req``) that the function consumed (it no longer
    flattens) its successor's contents, or (``clone``, none found) its own from before the
    call; see the module docstring. Returns the input nodes whose successor ``out`` (the
    result) holds; None when no input was consumed (the caller raises its own error).
    ``before``: each input's shallow state before the call (a loop's carry): one with a
    successor is put back as it was there."""
    objs, info = p.objs, p.info
    consumed = [
        k
        for k in container_index.values()
        if not isinstance(objs[k], _PLAIN) and not _flattens(objs[k])
    ]
    if not consumed:
        return None
    types = tuple({type(objs[k]) for k in consumed})
    candidates: dict[int, tuple[Any, bool]] = {}  # id -> (object, whether the result holds it)
    for in_result, tree in ((False, p.root), (True, out)):
        for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda y: isinstance(y, types)):
            if isinstance(x, types) and id(x) not in container_index:
                seen = candidates.get(id(x))
                candidates[id(x)] = (x, in_result or (seen is not None and seen[1]))
    returned = set()
    successor = _pair(p, consumed, list(candidates.values()))
    for k in consumed:
        e = info[k]
        found = successor.get(k)
        if found is None:
            found = [
                (x, r)
                for x, r in candidates.values()
                if type(x) is e.node_type and same_data(_node_data(x), e.data)
            ]
        if len(found) == 1 and before is not None and k in before:
            restore_shallow_state(objs[k], before[k][:2])
        elif len(found) == 1:
            write_custom(objs[k], found[0][0], None)
            if found[0][1]:
                returned.add(k)
        elif p.policy_of(k).mutations == "discard":
            old = unflatten_node(e.node_type, e.data, [objs[c] for c in e.children])
            write_custom(objs[k], old, None)
        else:
            _raise_lost(p, k, len(found))
    return returned


def _pair(p: Any, consumed: list[int], candidates: list[tuple[Any, bool]]) -> dict[int, list]:
    """Successors for inputs consumed together: where n inputs of one type and structure were
    consumed and n new objects of it were left (a model's State and its EMA copy's, both set
    and both returned), each input takes one. An input whose own unchanged children a single
    new object still holds (by identity: ``set`` copies the entries it does not change) takes
    that one; the others are paired in order, the inputs in the arguments' order with the new
    objects in the order they are found (the inputs, then the result): ``return y, state,
    ema_state`` for ``step(model, state, ema_state)``. Returns ``{input node: [(successor,
    whether the result holds it)]}`` for those paired."""
    objs, info = p.objs, p.info
    groups: dict[int, list[int]] = {}  # first input of each type and structure -> all of them
    for k in consumed:
        e = info[k]
        first = next(
            (
                g
                for g in groups
                if info[g].node_type is e.node_type and same_data(info[g].data, e.data)
            ),
            k,
        )
        groups.setdefault(first, []).append(k)
    paired: dict[int, list] = {}
    for first, ks in groups.items():
        if len(ks) < 2:
            continue
        e = info[first]
        found = [
            (x, r)
            for x, r in candidates
            if type(x) is e.node_type and same_data(_node_data(x), e.data)
        ]
        if len(found) != len(ks):
            continue
        held = [{id(c) for c in _children(x)} for x, _ in found]
        free = list(range(len(found)))
        left = []
        for k in ks:
            own = {id(objs[c]) for c in info[k].children}
            ties = [i for i in free if own & held[i]]
            if len(ties) == 1:
                paired[k] = [found[ties[0]]]
                free.remove(ties[0])
            else:
                left.append(k)
        for k, i in zip(left, free, strict=True):
            paired[k] = [found[i]]
    return paired


def _children(x: Any) -> list:
    """``x``'s children, one level (none: it cannot be flattened)."""
    try:
        return jax.tree_util.tree_flatten(x, is_leaf=lambda y: y is not x)[0]
    except Exception:  # noqa: BLE001
        return []


def _raise_lost(p: Any, k: int, count: int) -> None:
    """The error for an input consumed without one successor (``count`` found)."""
    req, what = p.req, type(p.objs[k]).__name__
    which = "none" if not count else f"{count}, not one"
    if p.policy_of(k).mutations == "error":
        change = (None, f"consumed (no {what} of its structure replaces it: {which} found)", None)
        raise_mutation_error(req.fun, [(k, [change])], req.sdef, p.objs, req.layout)
    where = Paths(req.sdef, p.objs, req.layout).paths.get(k, "?")
    raise ValueError(
        see(
            "consumed-state",
            f"{qualname(req.fun)} consumed the {what} at {where} (it can no longer be read, as an "
            f"equinox State once set or updated) and left no new {what} of its structure in its "
            f"result or its inputs to take its place ({which} found). Under policy 'alias' the "
            f"caller's {what} takes the contents of the one that replaced it: return the new "
            "state, as equinox's stateful layers do (`return out, state`).",
        )
    )
