"""``treeclone.call``: a function run eagerly (no jit) under a policy, with ``jit``'s rules."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from treeclone import _native, _trace
from treeclone.policies import Policy, as_policy


def call(fun: Callable[..., Any], *args: Any, policy: str | Policy = "clone", **kwargs: Any):
    """``fun(*args, **kwargs)`` run eagerly (no jit) under ``policy``.

    The same rules as ``treeclone.jit``: under ``clone`` the function runs on fresh copies of
    the containers and its result comes back as fresh containers; under ``alias`` its in-place
    mutations reach the caller's objects (all or nothing) and returned inputs are the caller's
    same objects; under ``strict`` a mutated input it does not return raises MutationError.
    """
    chosen = as_policy(policy)
    if chosen.identity == "duplicate":
        leaves, treedef = _native.flatten((args, kwargs))
        fresh_args, fresh_kwargs = treedef.unflatten(leaves)
        out = fun(*fresh_args, **fresh_kwargs)
        out_leaves, out_def = _native.flatten(out)
        return out_def.unflatten(out_leaves)
    root = (*args, dict(sorted(kwargs.items())))
    leaves, sdef, objects = _native.flatten_shared(root)
    try:
        params = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        params = []
    plan, outputs = _trace.run(
        fun,
        sdef,
        list(leaves),
        _trace.Layout(len(args), params[: len(args)]),
        chosen,
        lambda a, k: (a, k),
    )
    return plan.apply(leaves, objects, outputs)


__all__ = ["call"]
