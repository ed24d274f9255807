"""Where ``treeclone.jit``'s arrays are placed under a policy that writes back (alias, strict):
``in_shardings`` and ``out_shardings`` applied inside the computation, and the arrays the
function leaves in its arguments kept where the arrays they replace were (docs/semantics.md,
"Shardings").

An in-place update leaves a state where it was: an array written back (``state["w"] = ...``)
is given the sharding of the array it replaces, when that one is placed on several devices
(a mesh) or by ``in_shardings``; XLA chooses for the others, as under ``jax.jit``. Since JAX
keys its traces on shapes and types, not on where the arrays are, a call whose arguments are
on a mesh has their shardings in its key (:func:`placements`): the placement written back is
part of its trace. A function learns that at the first such call (:class:`Placement`), which
its trace refuses with ``ShardedArguments``; the call is made again with the shardings in the
key, and so is every later call (on the lean path too: ``_native.LeanCall`` keys them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
from jax.core import Tracer

from treeclone import _native, tree_util
from treeclone._docs import see
from treeclone._lift.naming import jit_keystr
from treeclone.policies import ArgPolicies, Policy

# Raised by the inner function at trace time for a call whose key holds no shardings and whose
# arguments are placed on several devices: the caller makes it again, keyed (the general path in
# Jitted._call_policy, the lean one in _native.LeanCall).
ShardedArguments = _native.ShardedArguments


def placements(leaves: Iterable[Any]) -> tuple:
    """Per leaf, the sharding of a committed ``jax.Array`` (None for any other leaf): the part of
    a call's key that says where its arguments are."""
    return tuple(
        x.sharding
        if isinstance(x, jax.Array) and not isinstance(x, Tracer) and x.committed
        else None
        for x in leaves
    )


def on_a_mesh(sharding: Any) -> bool:
    """Whether ``sharding`` places an array on several devices."""
    return sharding is not None and len(sharding.device_set) > 1


def specified(sharding: Any) -> bool:
    """jax.jit's reading of ``in_shardings``/``out_shardings``: None means not given."""
    return sharding is not None and type(sharding).__name__ != "UnspecifiedValue"


def _by_leaf(prefix: Any, tree: Any, name: str) -> dict[int, Any]:
    """``id(leaf) -> sharding`` for the leaves of ``tree`` under the sharding prefix ``prefix``
    (a None in it: not given there). One leaf at two places given two shardings cannot be one
    array in two placements: a ValueError naming both key paths."""
    found: dict[int, tuple[Any, str]] = {}

    def visit(path: tuple, sharding: Any, subtree: Any) -> None:
        if sharding is None:
            return
        for sub, leaf in jax.tree_util.tree_flatten_with_path(subtree)[0]:
            where = name + jit_keystr((*path, *sub))
            seen = found.setdefault(id(leaf), (sharding, where))
            if seen[0] != sharding:
                raise ValueError(
                    see(
                        "one-array-two-shardings",
                        f"{where} and {seen[1]} are one array, which out_shardings places at "
                        f"{sharding} and at {seen[0]}: under alias and strict an object returned "
                        "at two places is one object, as in plain Python, and one array has one "
                        "placement. Give both places one sharding, or return a copy at one of "
                        "them.",
                    )
                )

    jax.tree_util.tree_map_with_path(visit, prefix, tree, is_leaf=lambda x: x is None)
    return {k: sharding for k, (sharding, _) in found.items()}


def _constrain(x: Any, sharding: Any) -> Any:
    return jax.lax.with_sharding_constraint(x, sharding)


class Placement:
    """The placement rules of one inner function: its ``in_shardings`` and ``out_shardings``
    (None: not given), whether arrays written back keep their placement (``keep``), and
    whether its calls' keys hold their arguments' shardings (``keyed``: from the start with
    ``in_shardings``, whose check needs them; else from the first call on a mesh)."""

    def __init__(self, in_shardings: Any, out_shardings: Any, keep: bool):
        self.in_shardings = in_shardings if specified(in_shardings) else None
        self.out_shardings = out_shardings if specified(out_shardings) else None
        self.keep = keep
        self.keyed = self.in_shardings is not None

    def key_part(self, leaves: list) -> tuple | None:
        """The part of a call's key that says where its arguments are (None: not keyed)."""
        return placements(leaves) if self.keyed else None

    def check(self, leaves: Sequence[Any] | None, placed: tuple | None) -> None:
        """At trace time: ``ShardedArguments`` for a call (its concrete ``leaves``) on a mesh
        whose key holds no shardings (``placed``), so that it is made again with them."""
        if placed is not None or not self.keep or leaves is None:
            return
        if any(on_a_mesh(s) for s in placements(leaves)):
            self.keyed = True
            raise ShardedArguments()

    def inputs(
        self,
        sdef: Any,
        leaves: list,
        num_args: int,
        placed: tuple | None,
        names: Callable[[], list[str]],
        skip: frozenset[int] = frozenset(),
    ) -> tuple[list, list, str | None]:
        """``in_shardings`` applied to the input leaves, the sharding given to each (None: not
        given), and ``jax.jit``'s error, with its text, for a committed argument placed
        otherwise, naming its key path (``names()``: each slot's): the caller raises it once
        the function has run, as ``jax.jit`` checks the arguments after its trace. The slots
        ``skip`` (the leaves ``traced=`` leaves static) have no sharding: a sharding given for
        an argument applies to its traced leaves."""
        if self.in_shardings is None:
            return leaves, [None] * len(leaves), None
        args = sdef.unflatten(leaves)[:num_args]
        prefix = self.in_shardings
        if not isinstance(prefix, (tuple, list)):
            prefix = (prefix,) * num_args
        by_leaf = _by_leaf(tuple(prefix), tuple(args), "")
        given = [None if s in skip else by_leaf.get(id(x)) for s, x in enumerate(leaves)]
        problem = None
        for s, (want, have) in enumerate(zip(given, placed or (), strict=False)):
            if want is not None and have is not None and not _same_sharding(have, want, leaves[s]):
                problem = (
                    "Sharding passed to jit does not match the sharding on the respective "
                    f"arg. Got jit sharding: {want},\narg sharding: {have} for arg type: "
                    f"{leaves[s].aval} (argument {_name(names(), s)})"
                )
                break
        constrained = [
            x if w is None else _constrain(x, w) for x, w in zip(leaves, given, strict=True)
        ]
        return constrained, given, problem

    def outputs(self, out: Any) -> dict[int, Any]:
        """``id(leaf) -> sharding`` that ``out_shardings`` gives the leaves of the result
        ``out`` (empty when not given)."""
        if self.out_shardings is None:
            return {}
        return _by_leaf(self.out_shardings, out, "result")

    def kept(self, placed: tuple | None, given: list) -> list | None:
        """Per input slot, the placement an array written back in its place keeps: the one
        ``in_shardings`` gives it, else its own when on a mesh. None when there is none."""
        if not self.keep or (placed is None and self.in_shardings is None):
            return None
        placed = placed or (None,) * len(given)
        kept = [
            g if g is not None else (p if on_a_mesh(p) else None)
            for g, p in zip(given, placed, strict=True)
        ]
        return kept if any(k is not None for k in kept) else None


def _name(names: list[str], s: int) -> str:
    return names[s] if s < len(names) else "?"


def _same_sharding(have: Any, want: Any, x: Any) -> bool:
    """Whether array ``x``, placed as ``have``, is already placed as ``want``."""
    return have == want or have.is_equivalent_to(want, x.aval.ndim)


def argument_leaves(
    args: tuple,
    kwargs: dict,
    names: Sequence[str],
    policy: Policy | ArgPolicies,
    per_argument: Sequence[Policy] | None,
) -> list[tuple[str, Any]]:
    """``(key path, leaf)`` of every leaf of the arguments whose policy keeps or checks what
    the function leaves in them (alias, strict; not clone's, which are jax.jit's)."""
    arguments = [*zip(names, args, strict=True), *((str(k), v) for k, v in kwargs.items())]
    if per_argument is not None:
        chosen = [p.mutations != "discard" for p in per_argument]
    else:
        chosen = [policy.mutations != "discard"] * len(arguments)
    found = []
    for (name, value), take in zip(arguments, chosen, strict=True):
        if take:
            for path, leaf in tree_util.tree_flatten_with_path(value)[0]:
                found.append((name + jit_keystr(path), leaf))
    return found


def pins(
    before: list[tuple[str, Any]],
    after: list[tuple[str, Any]],
    slot_of: dict[int, int],
    kept: list,
    outputs: list,
) -> dict[int, Any]:
    """``output index -> sharding``: each output the function left at a key path of its
    arguments (``after``) keeps the placement ``kept`` gives the input slot that was there
    (``before``); an output at several such places keeps the first one's."""
    was = {path: slot_of[id(leaf)] for path, leaf in before if id(leaf) in slot_of}
    index: dict[int, int] = {}
    for o, x in enumerate(outputs):
        index.setdefault(id(x), o)
    found: dict[int, Any] = {}
    for path, leaf in after:
        at, slot = index.get(id(leaf)), was.get(path)
        if at is not None and slot is not None and kept[slot] is not None:
            found.setdefault(at, kept[slot])
    return found


def place_outputs(
    outputs: list, by_leaf: dict[int, Any], pinned: dict[int, Any], skip: Callable[[int], bool]
) -> list:
    """The outputs with their placements: ``out_shardings``'s (``by_leaf``) where given, else
    the one kept by a write-back (``pinned``); ``skip``: the outputs left as they are (static
    ones under ``traced=``)."""
    if not by_leaf and not pinned:
        return outputs
    placed = list(outputs)
    for o, x in enumerate(outputs):
        sharding = by_leaf.get(id(x), pinned.get(o))
        if sharding is not None and not skip(o):
            placed[o] = _constrain(x, sharding)
    return placed
