"""The call machinery jit, jit_partial and the lifted transformations share.

Below :mod:`treeclone.jit`, :mod:`treeclone.jit_partial`, ``_lift`` and the transformation modules
(and importing none of them), so that the package's import graph has no circle: how a call's
arguments are named in messages (:class:`Naming`, :func:`jit_keystr`), the cycle check every
policy makes before a flatten (:func:`check_arguments`, :func:`check_cycles`), the clone
policy's reporting of discarded changes (:func:`reporting`), the box the distinct leaves travel
in (:class:`ArgsBox`), the leaves ``traced=`` leaves static (:func:`leaf_rule`,
:class:`StaticLeaves`), and strict's ``jax.jit`` outputs (:func:`as_jit_outputs`).

``treeclone.jit`` re-exports what was public there (``argument_names``, ``reporting``,
``check_cycles``, ``check_arguments``, ``is_array``).
"""

from __future__ import annotations

import inspect
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np

from treeclone import _jax_compat, _native, _trace, tree_util

__all__ = [
    "ArgsBox",
    "Naming",
    "StaticLeaves",
    "argument_names",
    "as_jit_outputs",
    "check_arguments",
    "check_cycles",
    "is_array",
    "jit_keystr",
    "leaf_rule",
    "normalize",
    "reporting",
    "take",
]

# --- argument names ---------------------------------------------------------------------------

_FLAT_INDEX = re.compile(r"<flat index ([^>]+)>")


def jit_keystr(path: tuple) -> str:
    """A key path as jax.jit prints it in its messages: ``keystr``'s, with a flat index (a
    child of a node registered without keys) written ``[2]``, not ``[<flat index 2>]``.

    >>> from jax.tree_util import DictKey, FlattenedIndexKey, SequenceKey, keystr
    >>> from treeclone._calls import jit_keystr
    >>> path = (DictKey("a"), FlattenedIndexKey(2), SequenceKey(0))
    >>> keystr(path), jit_keystr(path)
    ("['a'][<flat index 2>][0]", "['a'][2][0]")
    """
    return _FLAT_INDEX.sub(r"\1", jax.tree_util.keystr(path))


class Naming:
    """How a function's arguments are named in messages, from its signature.

    >>> from treeclone._calls import Naming
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

        >>> from treeclone._calls import Naming
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

        >>> from treeclone._calls import Naming
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
    keyword). Also ``treeclone.jit.argument_names``.

    >>> from treeclone._calls import argument_names
    >>> def f(xs, *rest):
    ...     pass
    >>> argument_names(f, [0, 1, 2])
    ['xs', 'rest[0]', 'rest[1]']
    """
    naming = Naming(fun)
    return [naming.name(i) for i in positions]


# --- the cycle check ----------------------------------------------------------------------------


def normalize(indices: frozenset[int], n: int) -> frozenset[int]:
    """Argument positions of one call, negative ones counted from the end as jax.jit does.

    >>> from treeclone._calls import normalize
    >>> sorted(normalize(frozenset({0, -1}), 3))
    [0, 2]
    """
    if all(i >= 0 for i in indices):
        return indices
    return frozenset(i + n if i < 0 else i for i in indices)


def check_arguments(
    naming: Naming,
    args: tuple,
    kwargs: dict,
    static_nums: frozenset[int] = frozenset(),
    static_names: frozenset[str] = frozenset(),
) -> None:
    """Raise the ``ValueError`` of :func:`check_cycles`, naming the argument, before a JAX
    transformation's own flatten meets a cycle (jaxlib's, met with one, leaves the interpreter's
    recursion counter exhausted: every later call raises RecursionError). One native look
    through the arguments the transformation flattens (the static ones, positions
    ``static_nums``, a negative one counted from the end, and keywords ``static_names``, left
    out), at a fraction of a flatten's cost: under ``clone`` this is all a call adds.

    >>> from treeclone._calls import Naming, check_arguments
    >>> def f(xs, opt):
    ...     pass
    >>> loop = []
    >>> loop.append(loop)
    >>> check_arguments(Naming(f), ([1], loop), {}, frozenset({1}))  # opt is static: not looked at
    >>> check_arguments(Naming(f), (loop, "fast"), {}, frozenset({-1}))
    Traceback (most recent call last):
    ...
    ValueError: cycle detected in pytree: the list at xs contains itself at relative key path [0]
    """
    try:
        _native.check_arguments(args, kwargs, static_nums, static_names)
    except ValueError:
        check_cycles(naming, args, kwargs, static_nums, static_names)  # names the argument
        raise


def check_cycles(
    naming: Naming,
    args: tuple,
    kwargs: dict,
    static_nums: frozenset[int] = frozenset(),
    static_names: frozenset[str] = frozenset(),
) -> None:
    """Raise a ValueError naming the argument and key path of a container that contains
    itself, among the arguments that are flattened (static ones are hashed instead: a negative
    position counts from the end), with the same text under every policy. Other errors a
    flatten of them would raise are raised too.

    >>> from treeclone._calls import Naming, check_cycles
    >>> def f(xs, *rest):
    ...     pass
    >>> loop = []
    >>> loop.append(loop)
    >>> check_cycles(Naming(f), ([], {"a": loop}), {})
    Traceback (most recent call last):
    ...
    ValueError: cycle detected in pytree: the list at rest[0]['a'] contains itself at ...
    """
    static_nums, static_names = frozenset(static_nums), frozenset(static_names)
    try:
        _native.check_arguments(args, kwargs, static_nums, static_names)
        return
    except ValueError as error:
        found = error
    skip = normalize(static_nums, len(args))
    for i, arg in enumerate(args):
        if i not in skip:
            _native.check(arg, naming.name(i))
    for k, arg in kwargs.items():
        if k not in static_names:
            _native.check(arg, k)
    raise found  # what was found above, if no argument alone has it


# --- the clone policy ---------------------------------------------------------------------------


def reporting(
    fun: Any,
    static_nums: frozenset[int] = frozenset(),
    static_names: frozenset[str] = frozenset(),
    mode: str | None = None,
) -> Any:
    """``fun`` as the clone policy hands it to a JAX transformation: reporting, each time it is
    traced, the changes it makes in place and does not return (``_trace.ReportingDiscards``;
    the same object for the same function and options, so JAX's caches find it again). Also
    ``treeclone.jit.reporting``.

    >>> import jax, jax.numpy as jnp, warnings
    >>> from treeclone._calls import reporting
    >>> def bump(d):
    ...     d["n"] = d["n"] + 1
    >>> reporting(bump) is reporting(bump), reporting(bump).__wrapped__ is bump
    (True, True)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     jax.jit(reporting(bump))({"n": jnp.zeros(())})
    >>> caught[0].category.__name__
    'MutationWarning'
    """
    return _trace.reporting_discards(
        fun, lambda f: Naming(f).name, frozenset(static_nums), frozenset(static_names), mode
    )


# --- the box of a call's distinct leaves --------------------------------------------------------


class _Described(type):
    """How the box's type reads in JAX's explanation of a cache miss (``now <...> with 4
    children``): what it holds, not treeclone's class (treeclone's own explanation, logged
    with it, names the key paths)."""

    def __repr__(cls) -> str:
        return "<the arguments' distinct leaves, boxed by treeclone.jit>"


class ArgsBox(metaclass=_Described):
    """A call's distinct leaves, with ``key`` (structure, statics, donation) as static data: a
    pytree node, so the key is part of the structure JAX's caches key on.

    >>> import jax
    >>> from treeclone._calls import ArgsBox
    >>> leaves, treedef = jax.tree_util.tree_flatten(ArgsBox([1, 2], ("structure",)))
    >>> leaves, jax.tree_util.tree_unflatten(treedef, [3, 4]).key
    ([1, 2], ('structure',))
    """

    __slots__ = ("key", "leaves")

    def __init__(self, leaves: list, key: tuple):
        self.leaves = leaves
        self.key = key


# jax flattens an ArgsBox at every call: attrgetter does it without a Python frame.
jax.tree_util.register_pytree_node(
    ArgsBox, operator.attrgetter("leaves", "key"), lambda key, leaves: ArgsBox(list(leaves), key)
)
_native.invalidate_registry_cache()


def take(indices: list[int]) -> Callable[[list], list]:
    """``leaves -> [leaves[i] for i in indices]``, without a Python loop.

    >>> from treeclone._calls import take
    >>> take([2, 0])(["a", "b", "c"]), take([1])(["a", "b"]), take([])(["a"])
    (['c', 'a'], ['b'], [])
    """
    if not indices:
        return lambda leaves: []
    if len(indices) == 1:
        i = indices[0]
        return lambda leaves: [leaves[i]]
    getter = operator.itemgetter(*indices)
    return lambda leaves: list(getter(leaves))


def as_jit_outputs(leaves: list, slots: Sequence[int]) -> list:
    """``leaves`` with each of ``slots`` that is not a ``jax.Array`` (a Python scalar, a NumPy
    array or scalar) replaced by the array ``jax.jit`` returns for it: ``jax.device_put`` gives
    jax.jit's dtype and weak type for each (checked against jax.jit by
    ``tests/policies/test_strict_outputs.py``). A ``jax.Array`` stays the caller's object: it
    is immutable and equal to what jax.jit returns. A JAX Ref (``jax.new_ref``) stays the
    caller's Ref, as under alias: JAX never returns one, and a copy would not be the Ref the
    function wrote.

    >>> import jax.numpy as jnp
    >>> from treeclone._calls import as_jit_outputs
    >>> x = jnp.ones(2)
    >>> out = as_jit_outputs([1.0, x, "kept"], [0, 1])
    >>> out[0], out[1] is x, out[2]
    (Array(1., dtype=float32, weak_type=True), True, 'kept')
    """
    converted = None
    for s in slots:
        x = leaves[s]
        if not isinstance(x, jax.Array) and not _jax_compat.is_ref(x):
            if converted is None:
                converted = list(leaves)
            converted[s] = jax.device_put(x)
    return leaves if converted is None else converted


# --- leaves left static by a rule (``traced=``) -------------------------------------------------


def is_array(x: Any) -> bool:
    """Equinox's rule (``eqx.is_array``): JAX and NumPy arrays (and NumPy scalars) are traced,
    every other leaf is static. A tracer is a ``jax.Array``; so is a JAX Ref here. Also
    ``treeclone.jit.is_array``.

    >>> import jax.numpy as jnp, numpy as np
    >>> from treeclone._calls import is_array
    >>> [is_array(x) for x in (jnp.ones(2), np.ones(2), np.float32(1), 1.0, "relu", abs)]
    [True, True, True, False, False, False]
    """
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or _jax_compat.is_ref(x)


_LEAF_RULES: dict[str, Callable[[Any], bool]] = {"arrays": is_array, "equinox": is_array}


def leaf_rule(traced: str | Callable[[Any], bool] | None) -> Callable[[Any], bool] | None:
    """The predicate of ``jit(traced=...)``: None (every leaf traced, as jax.jit), a rule's
    name, or the user's own predicate.

    >>> from treeclone._calls import is_array, leaf_rule
    >>> leaf_rule(None), leaf_rule("arrays") is is_array, leaf_rule(callable) is callable
    (None, True, True)
    >>> leaf_rule("all")
    Traceback (most recent call last):
    ...
    ValueError: traced must be None, one of ['arrays', 'equinox'] or a predicate on a leaf, ...
    """
    if traced is None or callable(traced):
        return traced
    if isinstance(traced, str) and traced in _LEAF_RULES:
        return _LEAF_RULES[traced]
    raise ValueError(
        f"traced must be None, one of {sorted(_LEAF_RULES)} or a predicate on a leaf, "
        f"got {traced!r}"
    )


class StaticLeaves:
    """The leaves of a call that ``traced=`` leaves static: their slots and values, each keyed
    with its type (as jax.jit keys a static argument: ``2`` and ``2.0`` trace apart). Part of
    the inner jit's cache key, so a static leaf that changes (compared with ``==``, as equinox
    compares them) is a new trace."""

    __slots__ = ("entries", "hash", "slots")

    def __init__(self, entries: tuple[tuple[int, type, Any], ...]):
        self.entries = entries
        self.slots = frozenset(s for s, *_ in entries)
        self.hash = hash(entries)

    @classmethod
    def of(
        cls,
        leaves: list,
        traced: Callable[[Any], bool],
        args: tuple,
        kwargs: dict,
        naming: Naming,
    ) -> StaticLeaves | None:
        """Those of ``leaves`` that ``traced`` leaves static (None: none); a static leaf that
        cannot be hashed is a TypeError naming its argument and key path.

        >>> import jax.numpy as jnp
        >>> from treeclone._calls import Naming, StaticLeaves, is_array
        >>> def f(model):
        ...     pass
        >>> model = {"w": jnp.ones(2), "act": "relu", "sizes": [2, 3]}
        >>> leaves = [model["act"], 2, 3, model["w"]]
        >>> StaticLeaves.of(leaves, is_array, (model,), {}, Naming(f))
        static leaves [0, 1, 2]
        >>> StaticLeaves.of(leaves[3:], is_array, (model,), {}, Naming(f)) is None
        True
        >>> tags = {"a"}
        >>> StaticLeaves.of([tags], is_array, ({"tags": tags},), {}, Naming(f))
        Traceback (most recent call last):
        ...
        TypeError: model['tags']: a static leaf under traced= (not traced: a set) must be ...
        """
        entries = tuple((s, type(x), x) for s, x in enumerate(leaves) if not traced(x))
        if not entries:
            return None
        try:
            return cls(entries)
        except TypeError:
            for _, ty, x in entries:
                try:
                    hash(x)
                except TypeError:
                    raise TypeError(
                        f"{_leaf_path(x, args, kwargs, naming)}: a static leaf under traced= "
                        f"(not traced: a {ty.__name__}) must be hashable, as a static argument "
                        "must be: it is part of the compiled code's cache key. Make it a "
                        "pytree node or an array, or give traced= a rule that traces it."
                    ) from None
            raise

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, StaticLeaves) and other.entries == self.entries)

    def __hash__(self) -> int:
        return self.hash

    def __repr__(self) -> str:
        return f"static leaves {[s for s, *_ in self.entries]}"


def _leaf_path(leaf: Any, args: tuple, kwargs: dict, naming: Naming) -> str:
    """The first key path of ``leaf`` in the call's arguments, as jit names them."""
    for i, value in [*((naming.name(i), a) for i, a in enumerate(args)), *kwargs.items()]:
        for path, x in tree_util.tree_flatten_with_path(value)[0]:
            if x is leaf:
                return str(i) + jit_keystr(path)
    return "an argument"
