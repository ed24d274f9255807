"""The pytree nodes a lifted call travels in through a JAX transformation: :class:`ArgsBox`
(the distinct leaves in, the call's key as static data) and :class:`Out` (the outputs, the
trace's :class:`LiftRecord` as static data); and what ``strict`` hands back as ``jax.jit`` would
(:func:`as_jit_outputs`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax

from treeclone import _jax_compat, _native


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
    >>> from treeclone._lift import ArgsBox
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

    >>> from treeclone._lift import take
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
    >>> from treeclone._lift import as_jit_outputs
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


class LiftRecord:
    """What one trace recorded: the ``CallPlan``, what the transformation adds (``extra``,
    such as where the gradients go) and, under a ``traced=`` rule, the outputs the rule left
    static (``static_outputs``: position and value). The static data of an :class:`Out`,
    compared by identity, so that each of JAX's cached traces keeps its own."""

    __slots__ = ("extra", "plan", "static_outputs")

    def __init__(self, plan: Any, extra: Any = None):
        self.plan, self.extra = plan, extra
        self.static_outputs: tuple[tuple[int, Any], ...] = ()


class StaticOut:
    """An output of a traced function that its ``traced=`` rule leaves static (a function, a
    string, a Python number): :class:`Out` keeps it in its record, out of JAX's sight."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class Out:
    """The outputs of a lifted function, with its :class:`LiftRecord` as static data. Outputs
    given as :class:`StaticOut` are kept in the record: JAX sees None (an empty pytree) in
    their place, and every ``Out`` rebuilt from JAX's leaves has them back."""

    __slots__ = ("leaves", "record")

    def __init__(self, record: LiftRecord, leaves: Sequence[Any]):
        self.record, self.leaves = record, list(leaves)
        static = tuple((i, x.value) for i, x in enumerate(self.leaves) if type(x) is StaticOut)
        if static:
            record.static_outputs = static
            for i, value in static:
                self.leaves[i] = value


def _flatten_out(out: Out) -> tuple[list, LiftRecord]:
    static = () if out.record is None else out.record.static_outputs
    if not static:
        return out.leaves, out.record
    leaves = list(out.leaves)
    for i, _ in static:
        leaves[i] = None
    return leaves, out.record


def _unflatten_out(record: LiftRecord, leaves: Sequence[Any]) -> Out:
    out = object.__new__(Out)
    out.record, out.leaves = record, list(leaves)
    if record is not None:
        for i, value in record.static_outputs:
            out.leaves[i] = value
    return out


jax.tree_util.register_pytree_node(Out, _flatten_out, _unflatten_out)


_native.invalidate_registry_cache()
