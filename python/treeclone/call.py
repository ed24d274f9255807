"""``treeclone.call``: a function run eagerly (no jit) under a policy, with ``jit``'s rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from treeclone import _effects, _lift, tree_util
from treeclone._jax_compat import keystr
from treeclone._lift import Naming, reporting
from treeclone.policies import ArgPolicies, PolicySpec, as_policy_spec, for_call


def call(
    fun: Callable[..., Any],
    *args: Any,
    policy: PolicySpec | ArgPolicies = "clone",
    **kwargs: Any,
) -> Any:
    """``fun(*args, **kwargs)`` run eagerly (no jit) under ``policy``.

    The same rules as ``treeclone.jit``: under ``clone`` the function runs on fresh copies of
    the containers and its result comes back as fresh containers; under ``alias`` its in-place
    mutations reach the caller's objects (all or nothing) and returned inputs are the caller's
    same objects; under ``strict`` a mutated input it does not return raises MutationError.

    Mutable array leaves (NumPy arrays) are containers too: the function works on copies, so
    ``x += 1`` never reaches the caller under ``clone``, is written into the caller's array
    under ``alias`` once the call has succeeded, and is an error under ``strict`` unless the
    array is returned. ``policy`` may also be a dict giving a policy per argument, as for
    :func:`treeclone.jit` (``{"params": "alias", ...: "clone"}``).

    >>> import numpy as np, treeclone
    >>> x = np.zeros(2)
    >>> def bump(a):
    ...     a += 1
    >>> treeclone.call(bump, x); x.tolist()
    [0.0, 0.0]
    >>> treeclone.call(bump, x, policy="alias"); x.tolist()
    [1.0, 1.0]
    """
    spec = as_policy_spec(policy, fun)
    naming = Naming(fun)
    _lift.check_cycles(naming, args, kwargs)  # a cycle: the same text as jit's, naming it
    names = sorted(kwargs)
    # A policy per argument: the call runs under their combination (the lift's), each
    # argument's containers and arrays under its own.
    chosen, arg_policies = for_call(spec, range(len(args)), names)
    if chosen.identity == "duplicate":
        leaves, treedef = tree_util.tree_flatten((args, kwargs))
        fresh_args, fresh_kwargs = treedef.unflatten([_copy_if_mutable(x) for x in leaves])
        out = reporting(fun)(*fresh_args, **fresh_kwargs)  # a discarded change: a warning
        out_leaves, out_def = tree_util.tree_flatten(out)
        return out_def.unflatten(out_leaves)
    flat = _lift.flatten_call(naming, args, kwargs)
    leaves, sdef, objects = flat.leaves, flat.sdef, flat.objects
    root = (*args, dict(sorted(kwargs.items())))
    work = [_copy_if_mutable(x) for x in leaves]
    changed = _Changed(leaves, work)
    prepared = _lift.begin(fun, spec, naming, sdef, work, None, caller_objects=objects, eager=True)
    called = prepared.call()
    # strict hands a changed array back as the function's copy; alias writes it into the
    # caller's array below, so the caller's own array is handed back.
    planned = called.diff().plan(keep_inputs=changed if chosen.mutations == "error" else None)
    slot_mutations = _slot_mutations(sdef, len(args), arg_policies, chosen.mutations)
    strict = [s for s in changed.slots() if slot_mutations(s) == "error"]
    if strict:  # checked before anything is written back
        returned = {id(x) for x in tree_util.tree_leaves(called.out)}
        lost = [s for s in strict if id(work[s]) not in returned]
        if lost:
            _raise_array_mutation(fun, root, leaves, lost, prepared.req.layout)
    result = planned.plan.apply(leaves, objects, planned.outputs)
    if chosen.mutations == "propagate":
        for s in changed.slots():
            if slot_mutations(s) == "propagate":
                np.copyto(leaves[s], work[s])
    return result


def _slot_mutations(
    sdef: Any, num_args: int, arg_policies: Sequence[Any] | None, mutations: str
) -> Callable[[int], str]:
    """The mutations of each leaf slot's argument (``mutations``: every slot's, when the
    arguments share one policy). A NumPy array in an alias argument and in another is the
    alias one's."""
    if arg_policies is None:
        return lambda s: mutations
    root = sdef.num_nodes - 1
    per_child = sdef.child_slots(root)
    slots = list(per_child[:num_args])
    if len(per_child) > num_args:
        slots += sdef.child_slots(sdef.children_of(root)[num_args])
    found: dict[int, str] = {}
    rank = {"discard": 0, "error": 1, "propagate": 2}
    for policy, own in zip(arg_policies, slots, strict=True):
        for s in own:
            if rank[policy.mutations] >= rank[found.get(s, "discard")]:
                found[s] = policy.mutations
    return lambda s: found.get(s, "discard")


def _copy_if_mutable(x: Any) -> Any:
    """A copy of a writable NumPy array (mutable in place); any other leaf as it is."""
    if isinstance(x, np.ndarray) and x.flags.writeable:
        return x.copy()
    return x


class _Changed(Sequence):
    """Per leaf slot, whether it may be handed back as it came in: False for an array the
    function changed in place. Read by ``Diffed.plan`` after the function has run."""

    def __init__(self, originals: list, copies: list):
        self.originals, self.copies = originals, copies

    def changed(self, s: int) -> bool:
        a, b = self.originals[s], self.copies[s]
        if a is b:
            return False
        return a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes()

    def slots(self) -> list[int]:
        return [s for s in range(len(self.copies)) if self.changed(s)]

    def __getitem__(self, s: int) -> bool:  # type: ignore[override]
        return not self.changed(s)

    def __len__(self) -> int:
        return len(self.copies)


def _raise_array_mutation(fun, root, leaves, lost, layout) -> None:
    paths: dict[int, str] = {}
    for path, leaf in tree_util.tree_flatten_with_path(root)[0]:
        if id(leaf) not in paths and path:
            i = path[0].idx
            if i < layout.num_args:
                name = layout.arg_name(i) + keystr(path[1:])
            else:  # the kwargs dict: its keys are the argument names
                name = str(path[1].key) + keystr(path[2:])
            paths[id(leaf)] = name
    lines = [f"{paths.get(id(leaves[s]), '?')}: array changed in place" for s in lost]
    raise _effects.mutation_error(fun, lines)


__all__ = ["call"]
