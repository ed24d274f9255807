"""``treeclone.jit``'s options, read as ``jax.jit`` reads them: argument positions and names
completed from each other (:func:`resolve_arguments`), the keywords given a value other than
their default (:func:`given_options`), and the registry that lets every ``treeclone.jit`` of
one function with the same options share its inner ``jax.jit`` per policy
(:func:`inner_cache`), as two ``jax.jit(f)`` share one trace cache.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import jax


def as_tuple(x: int | str | Iterable | None) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


def parameters(fun: Callable) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None


def resolve_arguments(
    fun: Callable, nums: Any, names: Any
) -> tuple[frozenset[int], frozenset[str]]:
    """Argument positions and names, each completed from the other as jax.jit does."""
    nums, names = set(as_tuple(nums)), set(as_tuple(names))
    params = parameters(fun)
    if params is not None:
        positional = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        nums = {n + len(positional) if n < 0 else n for n in nums}
        names |= {positional[n] for n in nums if 0 <= n < len(positional)}
        nums |= {i for i, name in enumerate(positional) if name in names}
    return frozenset(nums), frozenset(names)


def hashable_options(kwargs: dict[str, Any]) -> tuple | None:
    """``kwargs`` as a hashable key, or None when some option is not hashable."""
    items = []
    for k, v in sorted(kwargs.items()):
        items.append((k, tuple(v) if isinstance(v, list) else v))
    key = tuple(items)
    try:
        hash(key)
    except TypeError:
        return None
    return key


# id(fun) -> (weak reference to fun, {options: {policy: (Inner, its jax.jit)}}). The entry goes
# when fun does; the inner functions hold fun weakly, so the registry never keeps fun alive.
# Not a _lift.Kept: that holds its keys strongly and drops the least recently used, while an
# inner jit (and its trace cache) must last exactly as long as fun, as jax.jit's does.
_SHARED: dict[int, tuple[weakref.ref, dict]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _SHARED.get(key)
    if entry is not None and entry[0] is ref:
        del _SHARED[key]


def inner_cache(fun: Callable, options: tuple | None) -> tuple[dict, bool]:
    """Where the inner jax.jit of each policy lives for ``fun`` and these options, and whether
    it is shared by every ``treeclone.jit`` of ``fun`` (so ``jit(f)`` written twice shares one
    trace cache, as two ``jax.jit(f)`` do): when the options are hashable and ``fun`` can be
    weakly referenced."""
    if options is None:
        return {}, False
    entry = _SHARED.get(id(fun))
    if entry is None or entry[0]() is not fun:
        try:
            ref = weakref.ref(fun, functools.partial(_forget, id(fun)))
        except TypeError:
            return {}, False
        entry = _SHARED[id(fun)] = (ref, {})
    return entry[1].setdefault(options, {}), True


class _Unspecified:
    """The default of ``in_shardings`` and ``out_shardings``: not given (printed as jax.jit's
    own default is)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UnspecifiedValue"


UNSPECIFIED: Any = _Unspecified()


# jax.jit's keywords (those of every JAX treeclone supports) with their defaults. A keyword is
# passed to jax.jit only when given a value other than its default, which is jax.jit's own
# default: so a keyword that this JAX does not have (abstracted_axes since JAX 0.8) is an error
# only when it is used, the TypeError jax.jit itself raises.
_JIT_DEFAULTS: dict[str, Any] = {
    "in_shardings": UNSPECIFIED,
    "out_shardings": UNSPECIFIED,
    "static_argnums": None,
    "static_argnames": None,
    "donate_argnums": None,
    "donate_argnames": None,
    "keep_unused": False,
    "device": None,
    "backend": None,
    "inline": False,
    "abstracted_axes": None,
    "compiler_options": None,
}


def _jax_jit_keywords() -> frozenset[str] | None:
    """The keywords this JAX's ``jax.jit`` takes (None: its signature is unknown)."""
    try:
        parameters = inspect.signature(jax.jit).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):  # pragma: no cover
        return None
    return frozenset(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


_JAX_JIT_KEYWORDS = _jax_jit_keywords()


def given_options(parameters: dict[str, Any]) -> dict[str, Any]:
    """The jax.jit options among ``parameters`` (``treeclone.jit``'s, by name) given a value
    other than their default, checked against this JAX's jax.jit at once (also in the
    decorator form), with the TypeError jax.jit raises."""
    given = {
        k: v for k, v in parameters.items() if k in _JIT_DEFAULTS and v is not _JIT_DEFAULTS[k]
    }
    for k in given:
        if _JAX_JIT_KEYWORDS is not None and k not in _JAX_JIT_KEYWORDS:
            raise TypeError(f"jit() got an unexpected keyword argument '{k}'")
    return given
