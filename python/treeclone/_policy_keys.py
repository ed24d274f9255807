"""A ``policy=`` dict's keys checked against the function's signature, for
:func:`treeclone.policies.as_policy_spec`: each position and its parameter's name completed from
the other, as ``jax.jit`` completes ``static_argnums`` and ``static_argnames``. Apart from
``policies`` so that the module every other imports stays short; it knows nothing of policies
(what a key maps to is compared by identity and shown by ``repr``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from treeclone._docs import see

Value = TypeVar("Value")


def complete_keys(
    by_position: dict[int, Value], by_name: dict[str, Value], fun: Callable[..., Any]
) -> None:
    """Check the positions (``int``, negative ones counted from the end of the positional
    parameters) and names (``str``) of a ``policy=`` dict against ``fun``'s signature and
    complete both dicts in place: a negative position made the position it counts to, and each
    positional parameter named by its position also named by its name, and back. An unknown
    name, a position beyond the parameters (unless ``fun`` takes ``*args``), or a position and
    its name given two values are ValueErrors; so is a negative position when ``fun``'s
    signature is unknown (then nothing is completed).

    >>> from treeclone._policy_keys import complete_keys
    >>> by_position, by_name = {-1: "alias"}, {}
    >>> complete_keys(by_position, by_name, lambda params, batch: None)
    >>> by_position, by_name
    ({1: 'alias'}, {'batch': 'alias'})
    """
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params is None:
        if any(i < 0 for i in by_position):
            raise ValueError(
                see(
                    "policy-argument",
                    "a negative position in policy needs fun's signature, which is unknown",
                )
            )
        return
    name = getattr(fun, "__qualname__", None) or repr(fun)
    shown = f"{name} ({', '.join(p.name for p in params)})"
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p.name for p in params if p.kind in kinds]
    keywords = {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    var_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    for i in list(by_position):
        j = i + len(positional) if i < 0 else i
        if j < 0 or (j >= len(positional) and not var_positional):
            raise ValueError(
                see(
                    "policy-argument",
                    f"policy names argument {i}, but {shown} has no such position",
                )
            )
        by_position[j] = by_position.pop(i)
    for k in by_name:
        if k not in keywords and k not in positional and not var_keyword:
            raise ValueError(
                see(
                    "policy-argument",
                    f"policy names {k!r}, which is not an argument of {shown}",
                )
            )
    # A position and its name are one argument (as static_argnums and static_argnames).
    for j, k in enumerate(positional):
        if j in by_position and k in by_name and by_position[j] is not by_name[k]:
            raise ValueError(
                see(
                    "policy-argument",
                    f"policy gives argument {j} ({k}) two policies: {by_position[j]!r} and "
                    f"{by_name[k]!r}",
                )
            )
        if j in by_position:
            by_name.setdefault(k, by_position[j])
        elif k in by_name:
            by_position[j] = by_name[k]
