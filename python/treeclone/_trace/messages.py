"""What a trace says: strict's ``MutationError``, clone's report of discarded changes, and the
``ValueError``s of a change no write-back can carry, each naming the user's function and the
key path (``Paths``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from treeclone._trace.tree import Paths
from treeclone.policies import MutationError, MutationWarning, Policy, discarded_mode


def qualname(fun: Any) -> str:
    """How messages name a user's function: its qualified name, else its ``repr``."""
    return getattr(fun, "__qualname__", None) or repr(fun)


def policy_name(policy: Policy) -> str:
    return repr(policy.name) if policy.name is not None else repr(policy)


REMEDY = (
    "Return the mutated object, or use policy='alias' to apply such mutations to the "
    "caller's objects, or policy='clone' to discard them."
)


def mutation_error(
    fun: Callable[..., Any], lines: list[str], remedy: str = REMEDY
) -> MutationError:
    """The strict policy's error: one line per unreturned mutation (``path: what``), then
    ``remedy``, what to do instead (the loops give their own where alias would not apply the
    change as the default text says)."""
    name = qualname(fun)
    return MutationError(
        f"{name} mutated its inputs in place without returning them (policy 'strict'):\n"
        + "\n".join(f"  {line}" for line in lines)
        + "\n"
        + remedy
    )


def mutation_lines(bad, pre_def, objs, layout) -> list[str]:
    """``path: what`` for each change of ``bad``, ``(node, changes)`` pairs
    (``describe_changes``)."""
    paths = Paths(pre_def, objs, layout)
    lines = []
    for k, changes in bad:
        for j, what, now in changes:
            where = paths.paths.get(k, "?") if j is None else paths.child(k, j, now)
            lines.append(f"{where or '(the arguments)'}: {what}")
    return lines


def raise_mutation_error(fun, bad, pre_def, objs, layout) -> None:
    raise mutation_error(fun, mutation_lines(bad, pre_def, objs, layout))


def raise_static_mutation(fun, changed: dict[int, list], pre_def, objs, layout) -> None:
    paths = Paths(pre_def, objs, layout).paths
    lines = []
    for k, found in changed.items():
        where = paths.get(k, "?") or "(the arguments)"
        for inner, _, _ in found:
            if inner:
                lines.append(f"{where}{inner}: changed in place, inside the static object {where}")
            else:
                lines.append(f"{where}: static object changed in place")
    raise mutation_error(fun, lines)


def raise_changed_elsewhere(fun, touched, pre_def, objs, layout) -> None:
    paths = Paths(pre_def, objs, layout).paths

    def name(key: int | tuple[int, str]) -> str:
        if isinstance(key, tuple):  # a container held in a registered node's attribute
            return f"{paths.get(key[0], '?') or '(the arguments)'}.{key[1]}"
        return paths.get(key, "?") or "(the arguments)"

    where = ", ".join(name(k) for k in touched)
    raise ValueError(
        f"{qualname(fun)} changed {where} through another name than its argument (a global, a "
        "closure, an attribute of another object) while that object was also passed in. "
        "The function works on the argument, so the two changes cannot both reach the "
        "caller's object; it was put back as it was. Change it through the argument only."
    )


def raise_outside_attribute(fun, k, name, pre_def, objs, layout) -> None:
    where = Paths(pre_def, objs, layout).paths.get(k, "?") or "(the arguments)"
    raise ValueError(
        f"{qualname(fun)} set the attribute {name!r} on {where} ({type(objs[k]).__name__}), which "
        "its pytree flatten does not carry, so the call cannot hand it back to the caller's "
        "object. Make it part of the node's flatten, or set it outside the transformed "
        "function."
    )


def raise_traced_static_data(fun, k, pre_def, objs, layout) -> None:
    where = Paths(pre_def, objs, layout).paths.get(k, "?") or "(the arguments)"
    name = qualname(fun)
    raise ValueError(
        f"{name} stored a traced value in the static data of {where} "
        f"({type(objs[k]).__name__}: a field its pytree flatten keeps as aux data, not as a "
        "leaf). Static data must be concrete: make that field a leaf, or compute it outside "
        "the transformed function."
    )


def report_off(mode: str | None) -> bool:
    """Whether discarded changes go unreported, as the block, ``mode`` or the global say."""
    return discarded_mode(mode) == "off"


def report_discarded(
    fun: Callable[..., Any],
    lines: list[str],
    mode: str | None,
    policy: str = "'clone' (what jax.jit does)",
) -> None:
    """Warn about (or raise for) the changes ``lines`` (``path: what``) that ``fun`` made in
    place and that ``clone`` discards, as the block's, the function's (``mode``) or the
    global setting says."""
    chosen = discarded_mode(mode)
    if chosen == "off" or not lines:
        return
    name = qualname(fun)
    text = (
        f"{name} changed its inputs in place without returning them; under policy {policy} "
        "these changes are discarded and the caller's objects keep their old values:\n"
        + "\n".join(f"  {line}" for line in lines)
        + "\nReturn the changed objects, or use policy='alias' to apply such changes to the "
        "caller's objects. (treeclone.set_discarded_mutations, or discarded_mutations= on "
        "treeclone.jit, says 'off' or 'error' instead of this warning.)"
    )
    if chosen == "error":
        raise MutationError(text)
    code = getattr(inspect.unwrap(fun), "__code__", None)
    if code is None:
        warnings.warn(text, MutationWarning, stacklevel=3)
    else:  # at the user's function: the trace that finds it runs deep inside jax
        warnings.warn_explicit(
            text,
            MutationWarning,
            code.co_filename,
            code.co_firstlineno,
            module=getattr(fun, "__module__", None),
        )
