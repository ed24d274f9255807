"""One ``treeclone.jit`` call under a policy, as its inner ``jax.jit`` is called: the cache
key (:class:`Key`: structure, static arguments, donation, static leaves, placements), which
leaves are donated (:class:`Donation`), the order the inner function takes the leaves in
(:func:`jit_order`) and the description of the call the trace reads (:class:`JitCall`), rebuilt
from what the native call records (:func:`lean_call_record`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax

from treeclone import _native
from treeclone._jit.placement import canonical
from treeclone._lift import (
    Naming,
    StaticLeaves,
    check_cycles,
    jit_keystr,
    name_slots,
    normalize,
    take,
)

# Donation masks kept per jitted function (one per argument structure seen; cleared when full).
MASK_CACHE_SIZE = 64


def is_static_slot(static: StaticLeaves | None, slot: int) -> bool:
    return static is not None and slot in static.slots


def jit_order(
    leaves: list, donation: Donation | None, static: StaticLeaves | None
) -> tuple[list, list | None]:
    """A call's distinct leaves (or anything per leaf, their names) as the inner jit takes
    them: the kept ones and the donated ones (None: no donation), without the static ones."""
    if static is None:
        if donation is None:
            return leaves, None
        return donation.kept(leaves), donation.donated(leaves)
    keep = None if donation is None else donation.keep
    kept = [x for s, x in enumerate(leaves) if s not in static.slots and (keep is None or keep[s])]
    if keep is None:
        return kept, None
    return kept, [x for s, x in enumerate(leaves) if s not in static.slots and not keep[s]]


def from_jit_order(
    kept: Sequence, donated: Sequence | None, keep: Sequence[bool] | None, static: Any
) -> list:
    """The inverse of :func:`jit_order`: every distinct leaf in its slot, the static ones
    (``static``: a ``StaticLeaves`` or None) put back as they are."""
    if keep is None and static is None:
        return list(kept)
    values = {} if static is None else {s: x for s, _, x in static.entries}
    n = len(kept) + len(donated or ()) + len(values)
    it_kept, it_donated = iter(kept), iter(donated or ())
    return [
        values[s] if s in values else next(it_kept if keep is None or keep[s] else it_donated)
        for s in range(n)
    ]


class Key(tuple):
    """The inner jit's static argument: ``(structure, static arguments, donation, static
    leaves, placements)``, the last the shardings of the arguments (``_jit.placement``; None
    when the function's calls are not keyed on them). A tuple, hashed and compared in C, but
    of a subclass, so that it is a pytree leaf: JAX before 0.7 flattens static arguments, and a
    key flattened as a tuple would walk the static values (a cyclic one without end,
    exhausting the recursion counter)."""

    __slots__ = ()


class Donation(tuple):
    """Which distinct leaves of a call are donated (``keep[s]`` False), and how to split the
    leaves into the kept ones and the donated ones (computed once per structure). Part of the
    inner jit's cache key: a tuple of the ``keep`` flags, hashed and compared in C (JAX hashes
    the key at every call, and a ``__hash__`` written in Python would run there)."""

    kept: Any
    donated: Any

    def __new__(cls, keep: tuple[bool, ...]) -> Donation:
        self = super().__new__(cls, keep)
        self.kept = take([s for s, k in enumerate(keep) if k])
        self.donated = take([s for s, k in enumerate(keep) if not k])
        return self

    @property
    def keep(self) -> tuple[bool, ...]:
        return self

    def __repr__(self) -> str:  # read in JAX's explanation of a cache miss
        return f"donated leaves {[s for s, k in enumerate(self.keep) if not k]}"


@dataclasses.dataclass(slots=True, eq=False)
class JitCall:
    """One call under a policy: what goes to the inner jit (``jitted(key, donated, *kept)``,
    see :class:`~treeclone._jit.inner.Inner`), and what naming it needs: its distinct
    ``leaves`` and the caller's ``objects``, the dynamic ``args`` and ``kwargs`` and the
    ``positions`` of the dynamic positional ones among all."""

    inner: Any
    jitted: Any
    key: tuple
    kept: list
    donated: list | None
    leaves: list
    objects: list
    args: tuple
    kwargs: dict
    positions: Sequence[int]

    @property
    def donation(self) -> Donation | None:
        return self.key[2]

    def named_arguments(self, naming: Naming) -> list[tuple[str, Any]]:
        """The call's dynamic arguments with the names jax.jit gives them, in its order."""
        statics = self.key[1]
        n = len(self.positions) if statics is None else statics[0]
        values = [*self.args, *self.kwargs.values()]
        static = () if statics is None else [k for k, *_ in statics[2]]
        names = naming.arguments(n, self.positions, self.kwargs, static)
        return list(zip(names, values, strict=True))

    def slot_names(self, naming: Naming) -> list[str]:
        """For each distinct leaf, its key path as jax.jit names it (the first place it is in)."""
        return name_slots(self.named_arguments(naming), self.leaves)


def lean_call_record(call: tuple) -> JitCall:
    """The ``JitCall`` of a native call from what ``_native.LeanCall`` records of it:
    ``(inner, jitted, key, leaves, objects, args, kwargs, positions)``, the dynamic arguments
    and their positions among all the positional ones (None: all)."""
    inner, jitted, key, leaves, objects, args, kwargs, positions = call
    if positions is None:
        positions = range(len(args))
    kept, donated = jit_order(leaves, key[2], key[3])
    return JitCall(inner, jitted, key, kept, donated, leaves, objects, args, kwargs, positions)


def hash_static(value: Any) -> None:
    """jax.jit's error for a static argument that cannot be hashed."""
    try:
        hash(value)
    except TypeError as exc:
        raise ValueError(
            "Non-hashable static arguments are not supported. An error occurred while trying "
            f"to hash an object of type {type(value)}, {value!r}. The error was:\n"
            f"{type(exc).__name__}: {exc}\n"
        ) from None


class CallShape:
    """How a jitted function's calls are taken apart for its inner jit: which arguments are
    static (``static_nums``, ``static_names``: hashed into the key) and donated
    (``donate_nums``, ``donate_names``: a :class:`Donation` per argument structure, kept in
    ``masks``), whether ``in_shardings`` is given, and the ``traced=`` rule (``traced``)."""

    def __init__(
        self,
        naming: Naming,
        static: tuple[frozenset[int], frozenset[str]],
        donate: tuple[frozenset[int], frozenset[str]],
        in_shardings_given: bool,
        traced: Callable[[Any], bool] | None,
    ):
        self.naming = naming
        self.static_nums, self.static_names = static
        self.donate_nums, self.donate_names = donate
        self.in_shardings_given, self.traced = in_shardings_given, traced
        self.masks: dict[tuple, Donation] = {}
        # How calls' static arguments are taken out and keyed, on both paths (None: none).
        self.statics = None
        if self.static_nums or self.static_names:
            self.statics = _native.StaticArguments(self.static_nums, self.static_names, hash_static)

    def refuse(self, failed: Exception, args: tuple, kwargs: dict) -> NoReturn:
        """The error of a call whose arguments the native call could not flatten
        (``failed``, a ``FlattenFailed`` whose cause is the flatten's error): jax.jit's for
        keywords with ``in_shardings``, the text of every policy for a cycle, naming the
        argument, else the flatten's own."""
        if kwargs and self.in_shardings_given:
            raise ValueError("pjit does not support kwargs when in_shardings is specified.")
        check_cycles(self.naming, args, kwargs, self.static_nums, self.static_names)
        raise failed.__cause__ or failed

    def lean_key(
        self,
        inner: Any,
        sdef: Any,
        statics: tuple | None,
        placed: tuple | None,
        static_entries: tuple | None,
        positions: Sequence[int] | None,
        args: tuple,
        kwargs: dict,
    ) -> tuple[Key, tuple[int, ...] | None, tuple[int, ...] | None]:
        """On a cache miss of the native call (``_native.LeanCall``): the key of a call of
        structure ``sdef`` (static arguments ``statics``, placements ``placed``, the leaves
        ``traced=`` leaves static ``static_entries``; each None when there is none), and the
        slots of the leaves the inner jit takes as kept and
        as donated (:func:`jit_order`; each None when every slot is kept, nothing donated).
        ``positions``, ``args`` and ``kwargs``: the call's dynamic arguments, for the donation
        mask and the error naming a static leaf that cannot be hashed."""
        if positions is None:
            positions = range(len(args))
        donation = None
        if self.donate_nums or self.donate_names:
            n = len(positions) if statics is None else statics[0]
            donation = self.mask(sdef, n, positions, kwargs)
        static = None
        if static_entries is not None:
            static = StaticLeaves.of_entries(static_entries, args, kwargs, self.naming)
        if placed is not None:  # read natively as they are: keyed in one spelling
            placed = tuple(None if s is None else canonical(s) for s in placed)
        key = Key((sdef, statics, donation, static, placed))
        if donation is None and static is None:
            return key, None, None
        kept, donated = jit_order(list(range(sdef.num_leaves)), donation, static)
        return key, tuple(kept), None if donated is None else tuple(donated)

    def not_a_jax_type(self, args: tuple, kwargs: dict) -> tuple[str, Any] | None:
        """The first leaf of a call's dynamic arguments that jax.jit cannot trace (a function,
        a string: not a JAX type) and its key path, or None (messages only)."""
        n = len(args)
        static = normalize(self.static_nums, n)
        named = [(self.naming.name(i), a) for i, a in enumerate(args) if i not in static]
        named += [(k, v) for k, v in kwargs.items() if k not in self.static_names]
        for name, value in named:
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                try:
                    jax.api_util.shaped_abstractify(leaf)
                except TypeError:
                    return name + jit_keystr(path), leaf
        return None

    def mask(self, sdef: Any, n: int, positions: Sequence[int], kwargs: dict) -> Donation:
        """The donation of a call: worked out once per structure and number of arguments
        (which fix the dynamic positions and the keyword names), then looked up."""
        key = (sdef, n)
        donation = self.masks.get(key)
        if donation is None:
            if len(self.masks) >= MASK_CACHE_SIZE:
                self.masks.clear()
            keep = self.keep_mask(sdef, positions, n, tuple(kwargs))
            donation = self.masks[key] = Donation(keep)
        return donation

    def keep_mask(
        self, sdef: Any, positions: Sequence[int], n: int, names: Sequence[str]
    ) -> tuple[bool, ...]:
        """Per distinct leaf: False when every occurrence is in a donated argument.

        ``positions[j]`` is the position, among the call's ``n``, of the j-th dynamic argument;
        ``names`` are the keyword arguments, in the order of the flattened kwargs dict.
        """
        donate_nums = normalize(self.donate_nums, n)
        root = sdef.num_nodes - 1
        kept: set[int] = set()
        donated: set[int] = set()
        per_child = sdef.child_slots(root)
        for j, position in enumerate(positions):
            (donated if position in donate_nums else kept).update(per_child[j])
        kwargs_node = sdef.children_of(root)[len(positions)]
        for name, slots in zip(names, sdef.child_slots(kwargs_node), strict=True):
            (donated if name in self.donate_names else kept).update(slots)
        return tuple(s in kept or s not in donated for s in range(sdef.num_leaves))
