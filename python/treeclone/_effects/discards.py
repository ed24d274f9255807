"""Clone's report: what a function run by a JAX transformation (``jax.jit``, ``jax.grad``,
``treeclone.call`` under ``clone``) changed in place and does not return, which the caller
never sees (a ``MutationWarning`` by default).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import NoneType
from typing import Any

from treeclone import _native
from treeclone._effects.diff import describe_changes, flatten_after, returned_nodes
from treeclone._effects.messages import mutation_lines, report_discarded, report_off
from treeclone._effects.tree import Layout, NodeInfo, unstable_static_data


def run_reporting_discards(
    fun: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    names: dict[int, str],
    static: frozenset[str] = frozenset(),
) -> tuple[Any, list[str]]:
    """``fun(*args, **kwargs)`` on containers made for this call (by ``jax.jit``, ``jax.grad``,
    ``treeclone.call`` under ``clone``), and a line ``path: what`` for each of those containers
    it changed in place and does not return: changes the caller never sees (``clone``
    discards them). ``names`` names the positional arguments that are traced, by position;
    keyword arguments are named by their keys. The other positions and the keywords in
    ``static`` are static arguments, not looked into.

    The same analysis as ``Called.diff``'s for ``strict``, on the containers themselves (nothing is
    rebuilt); static objects (rule J29) stay the caller's own, as in plain Python."""
    traced = [i for i in range(len(args)) if i in names]
    root = (*(args[i] for i in traced), {k: v for k, v in kwargs.items() if k not in static})
    layout = Layout(len(traced), [names[i] for i in traced])
    _, pre_def, objs = _native.flatten_shared(root)
    pre_info = pre_def.node_info()
    unstable = unstable_static_data(root, pre_info)
    containers: dict[int, NodeInfo] = {
        k: e
        for k, e in enumerate(pre_info)
        if isinstance(e, NodeInfo) and e.node_type is not NoneType
    }
    container_index = {id(objs[k]): k for k in containers}
    own_attributes = {
        k: set(vars(objs[k]))
        for k, e in containers.items()
        if e.node_type not in (list, dict) and hasattr(objs[k], "__dict__")
    }
    out = fun(*args, **kwargs)
    try:
        _, post_def, post_objs = flatten_after(root, out, objs, container_index)
    except Exception:  # noqa: BLE001 - the report never fails a call that JAX accepts
        # An input container that cannot be flattened any more: the function consumed it
        # (equinox's ``State`` once ``set`` refuses to be flattened again). Under clone it is
        # the call's own copy, the caller's is untouched: nothing to report. A result that
        # cannot be flattened is JAX's own error, raised when JAX flattens it.
        return out, []
    post_info = post_def.node_info()
    returned = returned_nodes(post_info, post_objs, container_index)
    lost = []
    for n, entry in enumerate(post_info):
        if not isinstance(entry, NodeInfo) or entry.node_type is NoneType:
            continue
        k = container_index.get(id(post_objs[n]))
        if k is None or k in returned:
            continue
        changes = describe_changes(
            containers[k], entry, objs, post_objs, (pre_info, post_info), None, k not in unstable
        )
        changes += [
            (None, f"attribute {name!r} set outside the pytree", None)
            for name in getattr(post_objs[n], "__dict__", ())
            if k in own_attributes and name not in own_attributes[k]
        ]
        if changes:
            lost.append((k, changes))
    return out, mutation_lines(lost, pre_def, objs, layout) if lost else []


class ReportingDiscards:
    """``fun`` for a JAX transformation under ``clone``: each time it is traced, what it changes
    in place and does not return is reported (``policies.report_discarded``: a
    ``MutationWarning`` by default, ``mode`` for this function). To JAX it looks like ``fun``:
    its name, and ``__wrapped__``, which jax unwraps for the source and the signature. ``fun``
    is held weakly where it can be (its owner holds it), so that a cache of these keyed by
    ``fun`` (:func:`reporting_discards`) does not keep it alive.
    ``name(i)`` names positional argument ``i``; ``static_nums``/``static_names`` are the
    static arguments, not looked into."""

    def __init__(
        self,
        fun: Callable[..., Any],
        name: Callable[[int], str],
        static_nums: frozenset[int] = frozenset(),
        static_names: frozenset[str] = frozenset(),
        mode: str | None = None,
    ):
        try:
            self._fun: Callable[[], Any] = weakref.ref(fun)
        except TypeError:
            self._fun = lambda: fun
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(fun, attribute):
                setattr(self, attribute, getattr(fun, attribute))
        self._name, self._mode = name, mode
        self._static_nums, self._static_names = static_nums, static_names

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return self._fun()

    def __repr__(self) -> str:  # jax's messages name the function by its repr
        return repr(self._fun())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fun = self._fun()
        if report_off(self._mode):
            return fun(*args, **kwargs)
        n = len(args)
        static = {i + n if i < 0 else i for i in self._static_nums}
        names = {i: self._name(i) for i in range(n) if i not in static}
        out, lines = run_reporting_discards(fun, args, kwargs, names, self._static_names)
        report_discarded(fun, lines, self._mode)
        return out


_reporting: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reporting_discards(
    fun: Any,
    name: Callable[[Any], Callable[[int], str]],
    static_nums: frozenset[int] = frozenset(),
    static_names: frozenset[str] = frozenset(),
    mode: str | None = None,
) -> Any:
    """The :class:`ReportingDiscards` of ``fun`` (with these static arguments and ``mode``):
    the same object for the same ``fun``, so that JAX's caches, keyed by the function, find
    it again (two ``treeclone.jit`` of one function share a trace as two ``jax.jit`` do; a
    ``cond`` branch or loop body passed at each call is traced once). ``fun`` itself when it
    is not callable (JAX's own error follows). ``name(fun)`` gives the namer of its
    arguments."""
    if not callable(fun):
        return fun
    key = (static_nums, static_names, mode)
    try:
        per_fun = _reporting.get(fun)
        if per_fun is None:
            per_fun = _reporting[fun] = {}
    except TypeError:  # not weakly referable, or unhashable: one for this call
        per_fun = {}
    found = per_fun.get(key)
    if found is None:
        found = per_fun[key] = ReportingDiscards(fun, name(fun), *key)
    return found
