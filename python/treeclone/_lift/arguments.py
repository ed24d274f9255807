"""A call's arguments, checked and flattened with identity: what every transformation's call
starts with (:func:`flatten_call` -> :class:`Call`), static arguments (:class:`Static`) and the
leaves a ``traced=`` rule leaves static (:class:`StaticLeaves`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from treeclone import _jax_compat, _native, tree_util
from treeclone._docs import see
from treeclone._effects import NAN_TYPES, same_static, static_hash, static_key
from treeclone._jax_compat import DebugInfo
from treeclone._lift.naming import Naming, jit_keystr, name_slots


def normalize(indices: frozenset[int], n: int) -> frozenset[int]:
    """Argument positions of one call, negative ones counted from the end as jax.jit does.

    >>> from treeclone._lift import normalize
    >>> sorted(normalize(frozenset({0, -1}), 3))
    [0, 2]
    """
    if all(i >= 0 for i in indices):
        return indices
    return frozenset(i + n if i < 0 else i for i in indices)


def check_cycles(
    naming: Naming,
    args: tuple,
    kwargs: dict,
    static_nums: frozenset[int] = frozenset(),
    static_names: frozenset[str] = frozenset(),
) -> None:
    """Raise the ``ValueError`` every policy raises for a cyclic argument (docs/semantics.md,
    rule J17), naming the argument and the key path of the container that contains itself,
    before a JAX transformation's own flatten meets the cycle (jaxlib's, met with one, leaves
    the interpreter's recursion counter exhausted: every later call raises RecursionError).
    Other errors a flatten of the arguments would raise are raised too. One native look
    through the arguments the transformation flattens (the static ones, positions
    ``static_nums``, a negative one counted from the end, and keywords ``static_names``, are
    hashed instead: left out), at a fraction of a flatten's cost: under ``clone`` this is all
    a call adds; the arguments are named only once a cycle is found.

    >>> from treeclone._lift import Naming, check_cycles
    >>> def f(xs, *rest):
    ...     pass
    >>> loop = []
    >>> loop.append(loop)
    >>> check_cycles(Naming(f), ([1], loop), {}, frozenset({1}))  # rest[0] is static: not looked at
    >>> check_cycles(Naming(f), ([], {"a": loop}), {})
    Traceback (most recent call last):
    ...
    ValueError: cycle detected in pytree: the list at rest[0]['a'] contains itself at ...
    """
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


class Static:
    """A static argument's value in a call's key: equal by value when hashable (the same
    object, or ``same_static``: a NaN is a NaN), else by identity (as ``jax.checkpoint`` keys
    its static arguments)."""

    __slots__ = ("hash", "hashable", "value")

    def __init__(self, value: Any):
        self.value = value
        try:
            self.hash, self.hashable = hash((type(value), static_hash(value))), True
        except TypeError:
            self.hash, self.hashable = id(value), False

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Static):
            return False
        if self.hashable and other.hashable:
            return same_static(self.value, other.value)
        return self.value is other.value


# (number of positional arguments, ((position, Static), ...), ((keyword, Static), ...)).
Statics = tuple[int, tuple[tuple[int, Static], ...], tuple[tuple[str, Static], ...]]


def is_array(x: Any) -> bool:
    """Equinox's rule (``eqx.is_array``): JAX and NumPy arrays (and NumPy scalars) are traced,
    every other leaf is static. A tracer is a ``jax.Array``; so is a JAX Ref here.

    >>> import jax.numpy as jnp, numpy as np
    >>> from treeclone._lift import is_array
    >>> [is_array(x) for x in (jnp.ones(2), np.ones(2), np.float32(1), 1.0, "relu", abs)]
    [True, True, True, False, False, False]
    """
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or _jax_compat.is_ref(x)


_LEAF_RULES: dict[str, Callable[[Any], bool]] = {"arrays": is_array, "equinox": is_array}


def leaf_rule(traced: str | Callable[[Any], bool] | None) -> Callable[[Any], bool] | None:
    """The predicate of ``jit(traced=...)``: None (every leaf traced, as jax.jit), a rule's
    name, or the user's own predicate.

    >>> from treeclone._lift import is_array, leaf_rule
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
        see(
            "invalid-option",
            f"traced must be None, one of {sorted(_LEAF_RULES)} or a predicate on a leaf, "
            f"got {traced!r}",
        )
    )


_TYPE_OF = operator.itemgetter(1)  # an entry's type


class StaticLeaves(tuple):
    """The leaves of a call that ``traced=`` leaves static: their slots and values, each keyed
    with its type (as jax.jit keys a static argument: ``2`` and ``2.0`` trace apart). Part of
    the cache key of the call's trace, so a static leaf that changes is a new trace: compared
    as equinox compares them, with ``==``, the same object first and a NaN equal to a NaN
    (``_effects.static_key``).

    A tuple of the entries as keyed, ``(slot, type, value)`` with a NaN value keyed as every
    NaN of its type, hashed and compared in C: JAX hashes the key at every call, and a
    ``__hash__`` written in Python would run there. ``entries`` holds the values themselves.
    Made with ``hashed=False`` it may hold a leaf that cannot be hashed, where the
    transformation accepts that (a loop or a cond, as ``eqx.partition``'s static part closed
    over ``jax.lax.scan`` or ``cond``): hashing it is a TypeError, and such a call is keyed on
    nothing, traced each time."""

    entries: tuple[tuple[int, type, Any], ...]
    slots: frozenset[int]

    def __new__(
        cls, entries: tuple[tuple[int, type, Any], ...], hashed: bool = True
    ) -> StaticLeaves:
        keyed = entries
        if not NAN_TYPES.isdisjoint(map(_TYPE_OF, entries)):  # a NaN keyed as every NaN
            keyed = tuple((s, ty, static_key(x)) for s, ty, x in entries)
        self = super().__new__(cls, keyed)
        self.entries = entries
        self.slots = frozenset(s for s, *_ in entries)
        if hashed:
            hash(self)  # a TypeError for a leaf that cannot be hashed
        return self

    @classmethod
    def of(
        cls,
        leaves: list,
        traced: Callable[[Any], bool],
        args: tuple,
        kwargs: dict,
        naming: Naming,
        hashed: bool = True,
    ) -> StaticLeaves | None:
        """Those of ``leaves`` that ``traced`` leaves static (None: none); a static leaf that
        cannot be hashed is a TypeError naming its argument and key path, unless ``hashed``
        is False (the call is then keyed on nothing: see the class).

        >>> import jax.numpy as jnp
        >>> from treeclone._lift import Naming, StaticLeaves, is_array
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
        >>> StaticLeaves.of([tags], is_array, ({"tags": tags},), {}, Naming(f), hashed=False)
        static leaves [0]
        """
        entries = tuple((s, type(x), x) for s, x in enumerate(leaves) if not traced(x))
        if not entries:
            return None
        return cls.of_entries(entries, args, kwargs, naming, hashed)

    @classmethod
    def of_entries(
        cls,
        entries: tuple[tuple[int, type, Any], ...],
        args: tuple,
        kwargs: dict,
        naming: Naming,
        hashed: bool = True,
    ) -> StaticLeaves:
        """The static leaves ``((slot, type, value), ...)`` of a call of ``args`` and
        ``kwargs`` (see :meth:`of`, whose error this raises).

        >>> from treeclone._lift import Naming, StaticLeaves
        >>> StaticLeaves.of_entries(((1, str, "relu"),), ("x", "relu"), {}, Naming(print))
        static leaves [1]
        """
        try:
            return cls(entries, hashed)
        except TypeError:
            for _, ty, x in entries:
                try:
                    static_hash(x)
                except TypeError:
                    raise TypeError(
                        see(
                            "unhashable-static-leaf",
                            f"{_leaf_path(x, args, kwargs, naming)}: a static leaf under traced= "
                            f"(not traced: a {ty.__name__}) must be hashable, as a static argument "
                            "must be: it is part of the compiled code's cache key. Make it a "
                            "pytree node or an array, or give traced= a rule that traces it.",
                        )
                    ) from None
            raise

    def __repr__(self) -> str:
        return f"static leaves {[s for s, *_ in self.entries]}"


def _leaf_path(leaf: Any, args: tuple, kwargs: dict, naming: Naming) -> str:
    """The first key path of ``leaf`` in the call's arguments, as jit names them."""
    for i, value in [*((naming.name(i), a) for i, a in enumerate(args)), *kwargs.items()]:
        for path, x in tree_util.tree_flatten_with_path(value)[0]:
            if x is leaf:
                return str(i) + jit_keystr(path)
    return "an argument"


class Call:
    """One call, flattened with identity: its distinct ``leaves``, their structure ``sdef``
    (with sharing), the caller's object at each node (``objects``), the dynamic ``args`` and
    ``kwargs`` that were flattened, the static arguments (``statics``, None without) and the
    leaves a ``traced=`` rule leaves static (``static``, None without)."""

    __slots__ = ("args", "kwargs", "leaves", "objects", "sdef", "static", "statics")

    def __init__(
        self,
        leaves: list,
        sdef: Any,
        objects: list,
        args: tuple,
        kwargs: dict,
        statics: Statics | None,
        static: StaticLeaves | None = None,
    ):
        self.leaves, self.sdef, self.objects = leaves, sdef, objects
        self.args, self.kwargs, self.statics, self.static = args, kwargs, statics, static

    def traced_leaves(self) -> list:
        """The leaves a JAX transformation is given: each static one (``traced=``) is None,
        an empty pytree that JAX passes through, and :func:`with_static` puts it back.

        >>> import numpy as np
        >>> from treeclone._lift import Naming, flatten_call, is_array
        >>> def f(x, act):
        ...     pass
        >>> flatten_call(Naming(f), (np.ones(2), "relu"), {}, traced=is_array).traced_leaves()
        [array([1., 1.]), None]
        """
        if self.static is None:
            return self.leaves
        slots = self.static.slots
        return [None if s in slots else x for s, x in enumerate(self.leaves)]

    def arg_slots(self) -> list[list[int]]:
        """The distinct leaves (slots) reachable from each dynamic positional argument.

        >>> from treeclone._lift import Naming, flatten_call
        >>> w = object()
        >>> flatten_call(Naming(print), ({"w": w, "b": 1}, w), {}).arg_slots()
        [[0, 1], [1]]
        """
        return self.sdef.child_slots(self.sdef.num_nodes - 1)[: len(self.args)]

    def slot_names(self, naming: Naming) -> list[str]:
        """For each distinct leaf, where it is in the call (the first place), as jax's
        messages name an argument: ``params['w']``.

        >>> from treeclone._lift import Naming, flatten_call
        >>> def step(params, x):
        ...     pass
        >>> w = object()
        >>> call = flatten_call(Naming(step), ({"w": w}, w), {"scale": 2.0})
        >>> call.slot_names(Naming(step))
        ["params['w']", 'scale']
        """
        named = [(naming.name(i), a) for i, a in enumerate(self.args)]
        named += [(str(k), v) for k, v in self.kwargs.items()]
        return name_slots(named, self.leaves)

    def input_names(self, naming: Naming) -> list[str] | None:
        """The names of the inputs a JAX transformation sees (:meth:`traced_leaves`: the
        static ones left out), for jax's messages; None where jax names nothing.

        >>> import numpy as np
        >>> from treeclone._lift import Naming, flatten_call, is_array
        >>> def f(x, act):
        ...     pass
        >>> call = flatten_call(Naming(f), (np.ones(2), "relu"), {}, traced=is_array)
        >>> call.input_names(Naming(f)) in (['x'], None)  # None: a jax naming nothing
        True
        """
        if DebugInfo is None:
            return None
        names = self.slot_names(naming)
        if self.static is None:
            return names
        return [n for s, n in enumerate(names) if s not in self.static.slots]

    def slot_path(self, naming: Naming, slot: int) -> str:
        """Where leaf ``slot`` is in the call, as messages name it (``params['w']``).

        >>> from treeclone._lift import Naming, flatten_call
        >>> def step(params, x):
        ...     pass
        >>> flatten_call(Naming(step), ({"w": 1.0}, 2.0), {}).slot_path(Naming(step), 1)
        'x'
        """
        target = self.leaves[slot]
        named = [(naming.name(i), a) for i, a in enumerate(self.args)]
        named += [(str(k), v) for k, v in self.kwargs.items()]
        for name, value in named:
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                if leaf is target:
                    return name + jit_keystr(path)
        return f"<leaf {slot}>"


def flatten_call(
    naming: Naming,
    args: tuple,
    kwargs: dict,
    static_nums: Iterable[int] = (),
    static_names: Iterable[str] = (),
    traced: Callable[[Any], bool] | None = None,
    hashed: bool = True,
) -> Call:
    """Flatten a call's dynamic arguments with identity (see the module docstring).

    ``static_nums`` (negative ones count from the end) and ``static_names`` are taken out and
    put in ``Call.statics``, to be part of the traced structure's key. ``traced`` (a rule of
    ``traced=``, resolved) leaves the leaves it rejects static: ``Call.static``, hashed as
    jit hashes them (an unhashable one is a TypeError naming its key path; with ``hashed``
    False it is accepted and the call keyed on nothing, see :class:`StaticLeaves`).

    >>> from treeclone._lift import Naming, flatten_call
    >>> w = [1.0]
    >>> call = flatten_call(Naming(print), (w, w, "mode"), {}, static_nums=(-1,))
    >>> call.leaves, call.args, call.statics[0], call.statics[1][0][1].value
    ([1.0], ([1.0], [1.0]), 3, 'mode')
    """
    nums = frozenset(i + len(args) if i < 0 else i for i in static_nums)
    names = frozenset(static_names)
    statics: Statics | None = None
    given = args, kwargs
    if nums or names:
        statics = (
            len(args),
            tuple((i, Static(args[i])) for i in sorted(nums) if 0 <= i < len(args)),
            tuple(sorted((k, Static(v)) for k, v in kwargs.items() if k in names)),
        )
        args = tuple(a for i, a in enumerate(args) if i not in nums)
        kwargs = {k: v for k, v in kwargs.items() if k not in names}
    if len(kwargs) > 1:  # keyword order is not part of a call's structure, as in jax.jit
        kwargs = dict(sorted(kwargs.items()))
    try:
        leaves, sdef, objects = _native.flatten_shared((*args, kwargs))
    except ValueError:
        check_cycles(naming, *given, nums, names)  # the text of every policy, naming the argument
        raise
    static = None
    if traced is not None:
        static = StaticLeaves.of(leaves, traced, args, kwargs, naming, hashed)
    return Call(leaves, sdef, objects, args, kwargs, statics, static)
