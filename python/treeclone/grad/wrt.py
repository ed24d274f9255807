"""What ``treeclone.grad`` differentiates under ``wrt=``: equinox's rule (``"arrays"``: the
floating arrays), an nnx filter (the values of the Variables ``nnx.state(arg, wrt)`` holds) or
the user's predicate ``(key_path, leaf) -> bool``; the leaves kept out of the computation
(:class:`Fixed`), and the gradient rebuilt in the form each library expects.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from treeclone import _native
from treeclone._docs import see
from treeclone._lift import Call, is_array


def is_inexact_array(x: Any) -> bool:
    """Equinox's ``eqx.is_inexact_array``: a JAX or NumPy array of a floating or complex dtype."""
    return is_array(x) and jax.dtypes.issubdtype(x.dtype, np.inexact)


class Wrt:
    """A ``wrt=`` resolved once: ``kind`` is ``"arrays"`` (equinox's rule), ``"nnx"`` (an nnx
    filter, ``predicate(path, variable)`` over the Variables; ``given`` is the filter as
    given, for ``nnx.state``) or ``"leaf"`` (the user's ``predicate(key_path, leaf)``)."""

    __slots__ = ("given", "kind", "predicate")

    def __init__(self, kind: str, predicate: Callable[[Any, Any], bool] | None, given: Any):
        self.kind, self.predicate, self.given = kind, predicate, given


def wrt_rule(wrt: Any) -> Wrt | None:
    """Resolve ``grad(wrt=...)``; None: every leaf of the differentiated arguments."""
    if wrt is None:
        return None
    if isinstance(wrt, str) and wrt in ("arrays", "equinox"):
        return Wrt("arrays", None, wrt)
    nnx_filter = isinstance(wrt, type) or not callable(wrt)
    nnx_filter = nnx_filter or type(wrt).__module__.startswith("flax.nnx.filterlib")
    if not nnx_filter:
        return Wrt("leaf", wrt, wrt)
    try:
        from flax.nnx import filterlib
    except ImportError:
        raise TypeError(
            see(
                "invalid-option",
                f"wrt={wrt!r}: a type or filter names nnx Variables and needs flax; without it "
                "give wrt='arrays' or a predicate (key_path, leaf) -> bool",
            )
        ) from None
    return Wrt("nnx", filterlib.to_predicate(wrt), wrt)


class Fixed:
    """The leaves of a call that ``wrt=`` keeps out of the computation's inputs (not arrays:
    a function, a string, a Python number), by slot; in the ``ArgsBox`` key, so JAX never
    sees them as leaves. Compared by identity: ``jax.value_and_grad`` does not key on it."""

    __slots__ = ("values",)

    def __init__(self, values: dict[int, Any]):
        self.values = values

    def merge(self, mask: Sequence[bool], it_diff: Any, it_other: Any) -> list:
        """Every leaf in its slot: the differentiated, the boxed and the fixed ones."""
        values = self.values
        return [
            values[s] if s in values else next(it_diff) if d else next(it_other)
            for s, d in enumerate(mask)
        ]


def wrt_hint(args: tuple, argnums: Sequence[int]) -> str:
    """What ``jax.grad``'s refusal of a leaf (an integer, a key) points to under treeclone: a
    ``wrt=`` that leaves it out (``nnx.Param`` where an argument is an nnx graph node)."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and any(nnx.graph.is_graph_node(args[i]) for i in argnums):
        return (
            "; or differentiate the parameters only, as nnx.grad does: "
            "treeclone.grad(..., wrt=nnx.Param) (the other Variables, such as Dropout's or "
            "BatchNorm's, are carried; under policy='alias' their updates reach the model)"
        )
    return (
        "; or choose what is differentiated with wrt=: wrt='arrays' (the floating arrays, as "
        "eqx.filter_grad does) or a predicate (key_path, leaf) -> bool; the other leaves are "
        "carried (under policy='alias' their updates reach the caller)"
    )


def untied(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with each array met again at another place replaced by a copy, so that every
    place is its own input: under ``clone`` (rule G4) a gradient with ``wrt=`` is
    ``jax.grad``'s and ``eqx.filter_grad``'s, one per place, not the total of the places (the
    lift flattens with identity). The call itself when no array is at two places."""
    try:
        leaves, treedef = _native.flatten((args, kwargs))
    except ValueError:  # a cycle: the lift's flatten raises it, naming the argument
        return args, kwargs
    seen: set[int] = set()
    untied, copied = [], False
    for x in leaves:
        if id(x) in seen and isinstance(x, (jax.Array, np.ndarray)):
            x, copied = (x.copy() if isinstance(x, np.ndarray) else jnp.array(x, copy=True)), True
        seen.add(id(x))
        untied.append(x)
    if not copied:
        return args, kwargs
    return treedef.unflatten(untied)


def variable_slots(call: Call, variables: Sequence[Any]) -> dict[int, list[int]]:
    """For each of ``variables`` (nnx Variables, by id), the slots of its leaves in the call,
    found through the caller's object at each node of the flattened call."""
    wanted = {id(v) for v in variables}
    found: dict[int, list[int]] = {}
    for node, obj in enumerate(call.objects):
        if id(obj) in wanted and id(obj) not in found:
            found[id(obj)] = [s for slots in call.sdef.child_slots(node) for s in slots]
    return found


def nnx_selection(
    rule: Wrt, call: Call, argnums: tuple[int, ...]
) -> tuple[set[int], list[Any], dict[int, list[int]]]:
    """Under an nnx filter: the slots differentiated (the values of the Variables
    ``nnx.state(arg, wrt)`` holds), per argument the gradient's template (that State, for an
    nnx graph node; None: the argument's structure) and the Variables' slots."""
    from flax import nnx

    chosen: set[int] = set()
    forms: list[Any] = []
    variables: list[Any] = []
    for i in argnums:
        arg = call.args[i]
        if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(arg)):
            forms.append(None)  # an array: no Variable to find (nnx.state fails on one)
            continue
        # nnx.state holds the caller's own Variables (the same objects), shared ones once.
        state = nnx.state(arg, rule.given)
        forms.append(state if nnx.graph.is_graph_node(arg) else None)
        variables += jax.tree_util.tree_leaves(state, is_leaf=is_variable)
    var_slots = variable_slots(call, variables)
    for slots in var_slots.values():
        chosen.update(slots)
    return chosen, forms, var_slots


def is_variable(x: Any) -> bool:
    from flax import nnx

    return isinstance(x, nnx.Variable)


def leaf_selection(
    rule: Wrt, call: Call, argnums: tuple[int, ...], per_arg: list[list[int]]
) -> set[int]:
    """The slots a leaf rule differentiates: equinox's (inexact arrays) or the user's
    predicate on each leaf's key path in its argument and the leaf."""
    slots = {s for i in argnums for s in per_arg[i]}
    if rule.kind == "arrays":
        return {s for s in slots if is_inexact_array(call.leaves[s])}
    predicate = cast(Callable[[Any, Any], bool], rule.predicate)
    chosen: set[int] = set()
    for i in argnums:
        picked = {
            id(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(call.args[i])[0]
            if predicate(path, leaf)
        }
        chosen.update(s for s in per_arg[i] if id(call.leaves[s]) in picked)
    return chosen


def wrt_selection(
    rule: Wrt, call: Call, argnums: tuple[int, ...], per_arg: list[list[int]]
) -> tuple[list[int], Fixed | None, list[Any], dict[int, list[int]]]:
    """What ``wrt=`` differentiates in a call: the slots (sorted), the leaves of the
    differentiated arguments kept out of the computation (not arrays), per argument the
    gradient's template (see :func:`nnx_selection`) and, under nnx, the Variables' slots."""
    forms: list[Any] = [None] * len(argnums)
    var_slots: dict[int, list[int]] = {}
    if rule.kind == "nnx":
        chosen, forms, var_slots = nnx_selection(rule, call, argnums)
    else:
        chosen = leaf_selection(rule, call, argnums, per_arg)
    # A leaf left out that is not an array is static: JAX never sees it (no TypeError).
    fixed = {
        s: call.leaves[s]
        for i in argnums
        for s in per_arg[i]
        if s not in chosen and not is_array(call.leaves[s])
    }
    return sorted(chosen), Fixed(fixed) if fixed else None, forms, var_slots


def nnx_grads(state: Any, var_slots: dict[int, list[int]], grad_of: dict[int, Any]) -> Any:
    """``nnx.grad``'s form: ``state`` (the caller's Variables that ``wrt`` names, shared ones
    once) with each Variable rebuilt around the gradient of its leaves (``grad_of``: by
    slot)."""

    def one(var: Any) -> Any:
        treedef = jax.tree_util.tree_structure(var)
        return jax.tree_util.tree_unflatten(treedef, [grad_of[s] for s in var_slots[id(var)]])

    return jax.tree_util.tree_map(one, state, is_leaf=is_variable)


def filtered_grads(
    structure: Sequence[tuple[Any, list[int]]],
    grads_flat: Sequence[Any],
    forms: Sequence[Any],
    diff_slots: Sequence[int],
    var_slots: dict[int, list[int]] | None,
) -> tuple:
    """The gradient of each differentiated argument under ``wrt=``: ``nnx.grad``'s State where
    ``forms`` has one, else the argument's structure with None at the leaves left out (what
    ``eqx.filter_grad`` returns)."""
    grads = []
    for (treedef, where), form in zip(structure, forms, strict=True):
        if form is None:
            grads.append(treedef.unflatten([None if j < 0 else grads_flat[j] for j in where]))
        else:
            grad_of = dict(zip(diff_slots, grads_flat, strict=True))
            grads.append(nnx_grads(form, var_slots or {}, grad_of))
    return tuple(grads)
