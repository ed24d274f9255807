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
import numpy as np
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec

from treeclone import _jax_compat, _native, tree_util
from treeclone._docs import see
from treeclone._lift import jit_keystr
from treeclone.policies import ArgPolicies, Policy

# Raised by the inner function at trace time for a call whose key holds no shardings and whose
# arguments are placed on several devices: the caller makes it again, keyed (the native call,
# _native.LeanCall, or the trace of a stage, Jitted._stage).
ShardedArguments = _native.ShardedArguments


def placements(leaves: Iterable[Any]) -> tuple:
    """Per leaf, the sharding of a committed ``jax.Array`` (None for any other leaf), in one
    spelling (:func:`canonical`): the part of a call's key that says where its arguments are."""
    return tuple(canonical(s) if s is not None else None for s in shardings(leaves))


def shardings(leaves: Iterable[Any]) -> tuple:
    """Per leaf, the sharding of a committed ``jax.Array`` as it is (None for any other leaf)."""
    return tuple(
        x.sharding
        if isinstance(x, jax.Array) and not isinstance(x, Tracer) and x.committed
        else None
        for x in leaves
    )


_CANONICAL: dict[Any, Any] = {}


def canonical(sharding: Any) -> Any:
    """``sharding`` in one spelling: a NamedSharding's spec without trailing Nones, so that the
    ``P(None,)`` that JAX gives an array by its type on a mesh with Explicit axes keys a call
    as the ``P()`` of the array it replaced does (one placement, one trace)."""
    spec = getattr(sharding, "spec", None)
    if not spec or spec[-1] is not None or type(sharding) is not NamedSharding:
        return sharding
    found = _CANONICAL.get(sharding)
    if found is None:
        if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
            return sharding
        entries = list(spec)
        while entries and entries[-1] is None:
            entries.pop()
        if len(_CANONICAL) >= 1024:
            _CANONICAL.clear()
        found = _CANONICAL[sharding] = NamedSharding(
            sharding.mesh, PartitionSpec(*entries), memory_kind=sharding.memory_kind
        )
    return found


def on_a_mesh(sharding: Any) -> bool:
    """Whether ``sharding`` places an array on several devices."""
    return sharding is not None and len(sharding.device_set) > 1


def specified(sharding: Any) -> bool:
    """jax.jit's reading of ``in_shardings``/``out_shardings``: None means not given."""
    return sharding is not None and type(sharding).__name__ != "UnspecifiedValue"


def _by_leaf(
    prefix: Any, tree: Any, what: str, label: Callable[[tuple], str]
) -> dict[int, tuple[Any, str]]:
    """``id(leaf) -> (sharding, key path)`` for the leaves of ``tree`` under the sharding prefix
    ``prefix`` (``what``: ``in_shardings`` or ``out_shardings``; a None in it: not given there),
    each named by ``label`` from its path in ``tree``. One leaf at two places given two
    shardings cannot be one array in two placements: a ValueError naming both key paths."""
    found: dict[int, tuple[Any, str]] = {}

    def visit(path: tuple, sharding: Any, subtree: Any) -> None:
        if sharding is None:
            return
        for sub, leaf in jax.tree_util.tree_flatten_with_path(subtree)[0]:
            where = label((*path, *sub))
            seen = found.setdefault(id(leaf), (sharding, where))
            if seen[0] != sharding:
                raise ValueError(
                    see(
                        "one-array-two-shardings",
                        f"{seen[1]} and {where} are one array, which {what} places at "
                        f"{seen[0]} and at {sharding}: under alias and strict an object at two "
                        "places is one object, as in plain Python, and one array has one "
                        "placement. Give both places one sharding, or pass (or return) a copy "
                        "at one of them.",
                    )
                )

    jax.tree_util.tree_map_with_path(visit, prefix, tree, is_leaf=lambda x: x is None)
    return found


def fits(sharding: Any, shape: tuple) -> bool:
    """Whether ``sharding`` can place an array of ``shape``: jax.jit's own check of its
    ``out_shardings`` (the rank, then each split dimension divided evenly)."""
    try:
        sharding.check_compatible_aval(shape)
        sharding.shard_shape(shape)
    except (ValueError, IndexError, TypeError, AttributeError):
        return False
    return True


def _check_fits(x: Any, sharding: Any, what: str, where: str) -> None:
    """jax.jit's error for an argument (``what``: ``arguments``) or an output (``outputs``)
    that ``in_shardings`` or ``out_shardings`` cannot place, at key path ``where`` (a
    PartitionSpec, which names a mesh made current, is left to JAX)."""
    if not isinstance(sharding, jax.sharding.Sharding):
        return
    try:
        _jax_compat.check_compatible_aval(sharding, _shape(x))
    except ValueError as exc:
        raise ValueError(
            f"One of pjit {what} with pytree key path {where} is incompatible with its "
            f"sharding annotation {sharding}: {exc}"
        ) from None
    sharding.shard_shape(_shape(x))  # jax.jit's IndivisibleError (a ValueError)


def _shape(x: Any) -> tuple:
    shape = getattr(x, "shape", None)
    return tuple(np.shape(x) if shape is None else shape)


def _spec_part(spec: Any, names: frozenset, inside: bool) -> Any:
    """``spec`` with only the mesh axes in ``names`` (``inside``) or only the others."""
    entries: list[Any] = []
    for entry in spec:
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            entries.append(None if inside else entry)
            continue
        axes = tuple(
            a for a in (entry if isinstance(entry, tuple) else (entry,)) if (a in names) == inside
        )
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries)


def _constrain(x: Any, sharding: Any) -> Any:
    """``x`` placed as ``sharding`` inside the computation, on a mesh of any kind (what
    jax.jit's ``out_shardings`` does at its boundary): its Auto axes by
    ``with_sharding_constraint``, its Explicit ones (a ``jax.make_mesh`` default) by
    ``reshard``, which JAX requires for them."""
    mesh: Any = getattr(sharding, "mesh", None)
    explicit = _jax_compat.explicit_axes(mesh) if isinstance(sharding, NamedSharding) else ()
    if not explicit:
        return jax.lax.with_sharding_constraint(x, sharding)
    mixed = len(explicit) < len(mesh.axis_names)
    part = NamedSharding(mesh, _spec_part(sharding.spec, explicit, True)) if mixed else sharding
    if _off_mesh(x):
        # A value on no mesh (an uncommitted argument under in_shardings): reshard alone
        # leaves it on its one device, where the mesh's axes cannot be; device_put first
        # moves it there, as jax.jit places such an argument before its call.
        x = jax.device_put(x, part)
    x = _jax_compat.reshard(x, part)
    if mixed:  # a mesh with Explicit and Auto axes: each kind placed by its own function
        auto = NamedSharding(mesh, _spec_part(sharding.spec, explicit, False))
        x = jax.lax.with_sharding_constraint(x, auto)
    return x


def _off_mesh(x: Any) -> bool:
    """Whether ``x``'s type places it on no mesh."""
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    return mesh is None or mesh.empty


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
        argument: Callable[[int], str],
        skip: frozenset[int] = frozenset(),
    ) -> tuple[list, list, str | None]:
        """``in_shardings`` applied to the input leaves, the sharding given to each (None: not
        given), and ``jax.jit``'s error, with its text, for a committed argument placed
        otherwise, naming its key path (``names()``: each slot's; ``argument(i)``: the name of
        positional argument ``i``, for one array given two shardings): the caller raises it once
        the function has run, as ``jax.jit`` checks the arguments after its trace. The slots
        ``skip`` (the leaves ``traced=`` leaves static) have no sharding: a sharding given for
        an argument applies to its traced leaves."""
        if self.in_shardings is None:
            return leaves, [None] * len(leaves), None
        args = sdef.unflatten(leaves)[:num_args]
        prefix = self.in_shardings
        if not isinstance(prefix, (tuple, list)):
            prefix = (prefix,) * num_args

        def label(path: tuple) -> str:
            return argument(path[0].idx) + jit_keystr(path[1:])

        by_leaf = _by_leaf(tuple(prefix), tuple(args), "in_shardings", label)
        given = [
            None if s in skip or id(x) not in by_leaf else by_leaf[id(x)][0]
            for s, x in enumerate(leaves)
        ]
        problem = None
        for s, (want, have) in enumerate(zip(given, placed or (), strict=False)):
            if want is not None and have is not None and not _same_sharding(have, want, leaves[s]):
                problem = (
                    "Sharding passed to jit does not match the sharding on the respective "
                    f"arg. Got jit sharding: {want},\narg sharding: {have} for arg type: "
                    f"{leaves[s].aval} (argument {_name(names(), s)})"
                )
                break
        constrained = list(leaves)
        for s, (x, want) in enumerate(zip(leaves, given, strict=True)):
            if want is not None:
                _check_fits(x, want, "arguments", _name(names(), s))
                constrained[s] = _constrain(x, want)
        return constrained, given, problem

    def outputs(self, out: Any) -> dict[int, tuple[Any, str]]:
        """``id(leaf) -> (sharding, key path)`` that ``out_shardings`` gives the leaves of the
        result ``out`` (empty when not given)."""
        if self.out_shardings is None:
            return {}
        return _by_leaf(
            self.out_shardings, out, "out_shardings", lambda path: "result" + jit_keystr(path)
        )

    def kept(self, placed: tuple | None, given: list, actual: tuple | None = None) -> list | None:
        """Per input slot, the placement an array written back in its place keeps: the one
        ``in_shardings`` gives it, else its own when on a mesh (spelled as the arguments of the
        call traced spell it, ``actual``, where known: the key's spelling is
        :func:`canonical`). None when there is none."""
        if not self.keep or (placed is None and self.in_shardings is None):
            return None
        if placed is not None and actual is not None and len(actual) == len(placed):
            placed = actual
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
    (``before``) when that placement fits its shape (else XLA places it, or its type on a mesh
    with Explicit axes, as jax.jit places an output it is not told about: a sharded vector
    replaced by its mean); an output at several such places keeps the first one's."""
    was = {path: slot_of[id(leaf)] for path, leaf in before if id(leaf) in slot_of}
    index: dict[int, int] = {}
    for o, x in enumerate(outputs):
        index.setdefault(id(x), o)
    found: dict[int, Any] = {}
    for path, leaf in after:
        at, slot = index.get(id(leaf)), was.get(path)
        if at is None or slot is None or kept[slot] is None or at in found:
            continue
        if fits(kept[slot], _shape(outputs[at])):
            found[at] = kept[slot]
    return found


def place_outputs(
    outputs: list,
    by_leaf: dict[int, tuple[Any, str]],
    pinned: dict[int, Any],
    skip: Callable[[int], bool],
) -> list:
    """The outputs with their placements: ``out_shardings``'s (``by_leaf``, each with its key
    path: jax.jit's error for one that cannot place its output) where given, else the one
    kept by a write-back (``pinned``); ``skip``: the outputs left as they are (static ones
    under ``traced=``)."""
    if not by_leaf and not pinned:
        return outputs
    placed = list(outputs)
    for o, x in enumerate(outputs):
        if skip(o):
            continue
        given = by_leaf.get(id(x))
        if given is not None:
            _check_fits(x, given[0], "outputs", given[1])
            placed[o] = _constrain(x, given[0])
        elif o in pinned:
            placed[o] = _constrain(x, pinned[o])
    return placed
