"""How a call's arguments and leaves are named in messages, as ``jax.jit`` names them.

>>> from treeclone._lift import Naming, jit_keystr
>>> Naming(lambda params, *rest: None).name(2), jit_keystr(())
('rest[1]', '')
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from treeclone._jax_compat import INITIAL_RESULT_PATHS, DebugInfo

_FLAT_INDEX = re.compile(r"<flat index ([^>]+)>")


def jit_keystr(path: tuple) -> str:
    """A key path as jax.jit prints it in its messages: ``keystr``'s, with a flat index (a
    child of a node registered without keys) written ``[2]``, not ``[<flat index 2>]``.

    >>> from jax.tree_util import DictKey, FlattenedIndexKey, SequenceKey, keystr
    >>> from treeclone._lift import jit_keystr
    >>> path = (DictKey("a"), FlattenedIndexKey(2), SequenceKey(0))
    >>> keystr(path), jit_keystr(path)
    ("['a'][<flat index 2>][0]", "['a'][2][0]")
    """
    return _FLAT_INDEX.sub(r"\1", jax.tree_util.keystr(path))


class Naming:
    """How a function's arguments are named in messages, from its signature.

    >>> from treeclone._lift import Naming
    >>> def f(xs, *rest, **options):
    ...     pass
    >>> naming = Naming(f)
    >>> naming.positional, naming.var_positional, naming.var_keyword
    (['xs'], 'rest', 'options')
    """

    __slots__ = ("positional", "signature", "var_keyword", "var_positional")

    def __init__(self, fun: Callable):
        try:
            self.signature: inspect.Signature | None = inspect.signature(fun)
        except (TypeError, ValueError):
            self.signature = None
        params = [] if self.signature is None else list(self.signature.parameters.values())
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.positional = [p.name for p in params if p.kind in kinds]
        self.var_positional = next(
            (p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None
        )
        self.var_keyword = next(
            (p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )

    def name(self, i: int) -> str:
        """The name of the call's ``i``-th positional argument.

        >>> from treeclone._lift import Naming
        >>> def f(xs, *rest):
        ...     pass
        >>> [Naming(f).name(i) for i in range(3)], Naming(min).name(1)
        (['xs', 'rest[0]', 'rest[1]'], 'args[1]')
        """
        if i < len(self.positional):
            return self.positional[i]
        if self.var_positional is not None:
            return f"{self.var_positional}[{i - len(self.positional)}]"
        return f"args[{i}]"

    def arguments(
        self, n: int, positions: Sequence[int], kwargs: Iterable[str], static: Iterable[str]
    ) -> list[str]:
        """Names of the arguments at ``positions`` (of ``n`` positional ones) and of the keyword
        arguments ``kwargs`` (``static``: the static ones, not named), as jax.jit names them:
        by the signature when the call binds to it, else ``args[i]`` and ``kwargs['k']``.

        >>> from treeclone._lift import Naming
        >>> def f(x, y, **options):
        ...     pass
        >>> Naming(f).arguments(1, [0], ["y", "scale"], [])
        ['x', 'y', "options['scale']"]
        >>> Naming(f).arguments(3, [0, 2], [], [])  # does not bind: jax.jit's fallback names
        ['args[0]', 'args[2]']
        """
        kwargs = list(kwargs)
        try:
            if self.signature is None:
                raise TypeError
            self.signature.bind(*[None] * n, **dict.fromkeys([*kwargs, *static]))
        except TypeError:
            return [f"args[{i}]" for i in positions] + [f"kwargs['{k}']" for k in kwargs]
        params = self.signature.parameters
        return [self.name(i) for i in positions] + [
            k
            if k in params and params[k].kind is not inspect.Parameter.VAR_KEYWORD
            else f"{self.var_keyword}['{k}']"
            for k in kwargs
        ]


def argument_names(fun: Callable, positions: Iterable[int]) -> list[str]:
    """The names of a call's positional arguments at ``positions``, as messages give them.

    The parameter's own name; for a value collected by a ``*rest`` parameter, ``rest[j]`` (its
    index in ``rest``); ``args[i]`` when the signature is unknown or has no place for it. These
    are the names ``jax.jit`` uses; ``treeclone.jit`` and ``treeclone.call`` name the arguments
    of a :class:`~treeclone.MutationError` with them (keyword arguments are named by their
    keyword).

    >>> from treeclone._lift import argument_names
    >>> def f(xs, *rest):
    ...     pass
    >>> argument_names(f, [0, 1, 2])
    ['xs', 'rest[0]', 'rest[1]']
    """
    naming = Naming(fun)
    return [naming.name(i) for i in positions]


def name_slots(named: Iterable[tuple[str, Any]], leaves: Sequence[Any]) -> list[str]:
    """For each of a call's distinct ``leaves``, where it is in the call (its first place) as
    jax's messages name it (``params['w']``), given the call's arguments with their names
    (``named``: ``(name, value)`` pairs).

    >>> from treeclone._lift import name_slots
    >>> w = object()
    >>> name_slots([("params", {"w": w, "n": 2}), ("x", w)], [2, w])
    ["params['n']", "params['w']"]
    """
    found: dict[int, list[str]] = {}
    for name, value in named:
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            found.setdefault(id(leaf), []).append(name + jit_keystr(path))
    # A Python scalar is a value: one object may be several leaves; name them in turn.
    seen: dict[int, int] = {}
    names = []
    for leaf in leaves:
        places = found.get(id(leaf), [""])
        k = seen[id(leaf)] = seen.get(id(leaf), -1) + 1
        names.append(places[min(k, len(places) - 1)])
    return names


def debug_info(traced_for: str, sourceinfo: Any, names: Iterable[str] | None) -> Any:
    """jax's description of a traced function (``__fun_debug_info__``, read by jax >= 0.7):
    what it is traced for, its source and the names of its inputs, so that jax's messages
    (a traced value used as a bool, a non-array input) name the user's function and key
    paths. None where jax names nothing, or it cannot be made: naming is best effort and
    never fails a call.

    >>> from treeclone._lift import debug_info
    >>> debug_info("jit", None, None) is None
    True
    """
    if names is None or DebugInfo is None:
        return None
    try:
        return DebugInfo(traced_for, sourceinfo, tuple(names), INITIAL_RESULT_PATHS)
    except Exception:  # noqa: BLE001 - naming is best effort; never fail a call over it
        return None
