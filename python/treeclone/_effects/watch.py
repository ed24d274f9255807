"""What a trace watches while the user's function runs: the caller's own containers the function
may reach through another name (rule J30), the ``register_static`` objects strict checks
(rule J29), and which containers were rebuilt for a call now running (rule J31).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from types import NoneType
from typing import Any

from treeclone._effects.messages import raise_changed_elsewhere
from treeclone._effects.tree import Layout, NodeInfo
from treeclone._jax_compat import flatten_one_level_with_keys as keyed_children
from treeclone._jax_compat import registry

# .stack: per function running here now (``Prepared.call``), its rebuilt objects' ids and the
# trace it runs under (None: the caller's own, treeclone.call's)
_running = threading.local()


@contextlib.contextmanager
def running_on(objs: Sequence[Any], trace: Any = None) -> Iterator[None]:
    """While the block runs, ``objs`` (containers rebuilt for a function) are
    :func:`made_for_a_call`: a treeclone transformation writes them back itself; and
    ``trace``, the JAX transformation's trace it runs the function under, is
    :func:`traced_by_a_call`."""
    stack = _running.__dict__.setdefault("stack", [])
    stack.append(({id(o) for o in objs}, trace))
    try:
        yield
    finally:
        stack.pop()


def made_for_a_call(obj: Any) -> bool:
    """Whether ``obj`` is a container ``prepare`` rebuilt for a function running now in this
    thread (its ids are those of live objects: the ``Prepared`` step holds them)."""
    return any(id(obj) in ids for ids, _ in getattr(_running, "stack", ()))


def traced_by_a_call(trace: Any) -> bool:
    """Whether ``trace`` is the one a treeclone transformation running now in this thread
    runs its function under (its own ``jax.grad``'s, ``jax.vmap``'s, ...)."""
    return trace is not None and any(t is trace for _, t in getattr(_running, "stack", ()))


class Same:
    """Compares by identity (a snapshot's values must be the very same objects)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and self.value is other.value

    __hash__ = None  # type: ignore[assignment]


def shallow_state(obj: Any) -> tuple:
    """What a static object holds one level down (attributes, items), by identity."""
    attrs = {n: Same(v) for n, v in getattr(obj, "__dict__", {}).items()}
    items: Any = None
    if isinstance(obj, dict):
        items = [(k, Same(v)) for k, v in obj.items()]
    elif isinstance(obj, list):
        items = [Same(v) for v in obj]
    return attrs, items


def restore_shallow_state(obj: Any, state: tuple) -> None:
    attrs, items = state
    if hasattr(obj, "__dict__"):
        for name in [n for n in vars(obj) if n not in attrs]:
            object.__delattr__(obj, name)
        for name, value in attrs.items():
            object.__setattr__(obj, name, value.value)
    if isinstance(obj, dict):
        obj.clear()
        obj.update((k, v.value) for k, v in items)
    elif isinstance(obj, list):
        obj[:] = [v.value for v in items]


# How many objects strict watches from one static object (docs/semantics.md, rule J29).
STATIC_WATCH_LIMIT = 10_000


class _Members:
    """A set's members, compared by identity whatever their order."""

    __slots__ = ("ids", "values")

    def __init__(self, values: set):
        self.values = list(values)
        self.ids = frozenset(map(id, self.values))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Members) and self.ids == other.ids

    __hash__ = None  # type: ignore[assignment]


def _static_state(obj: Any) -> Any:
    """A watched object's state one level down, by identity (``shallow_state``; a set's
    members, a bytearray's bytes), with its attributes."""
    if isinstance(obj, set):
        return _Members(obj), shallow_state(obj)
    if isinstance(obj, bytearray):
        return bytes(obj), shallow_state(obj)
    return shallow_state(obj)


def restore_static_state(obj: Any, state: Any) -> None:
    if isinstance(obj, (set, bytearray)):
        contents, state = state
        if isinstance(obj, set):
            obj.clear()
            obj.update(contents.values)
        else:
            obj[:] = contents
    restore_shallow_state(obj, state)


def _is_static_object(obj: Any) -> bool:
    """Whether ``obj`` is a ``register_static`` object: a node with no children whose aux data
    is the object itself."""
    if type(obj) not in registry:
        return False
    try:
        children, aux = keyed_children(obj)
    except Exception:  # noqa: BLE001 - not one to watch
        return False
    return not children and aux is obj


def _watched_inside(obj: Any) -> bool:
    """Whether strict looks inside ``obj``, reached from a static object: the containers of
    plain data (lists, dicts, sets, tuples, bytearrays and their subclasses), dataclass
    instances and other static objects. Anything else (an array, a function, a module, an
    object of another class) is compared by identity only: its insides may be a cache that
    legitimately changes (a jitted function's)."""
    if isinstance(obj, (list, dict, set, tuple, bytearray)):
        return True
    if isinstance(obj, type):
        return False
    return dataclasses.is_dataclass(obj) or _is_static_object(obj)


def static_snapshot(root: Any) -> list[tuple[str, Any, Any]]:
    """``(where, object, state)`` for a static object and each object strict watches inside it
    (``_watched_inside``), reached through attributes (``__dict__``) and items, breadth first
    (``where``: the shortest path from the static object, ``.layers[0]``), each object once,
    at most ``STATIC_WATCH_LIMIT`` of them."""
    found: list[tuple[str, Any, Any]] = []
    seen: set[int] = set()
    agenda = collections.deque([("", root)])
    while agenda and len(found) < STATIC_WATCH_LIMIT:
        where, obj = agenda.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if not isinstance(obj, tuple):  # a tuple cannot change; what it holds can
            found.append((where, obj, _static_state(obj)))
        inside: list[tuple[str, Any]] = []
        if isinstance(obj, dict):
            inside += [(f"{where}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            inside += [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
        elif isinstance(obj, set):
            inside += [(f"{where}<member>", v) for v in obj]
        inside += [(f"{where}.{n}", v) for n, v in getattr(obj, "__dict__", {}).items()]
        agenda.extend((w, v) for w, v in inside if id(v) not in seen and _watched_inside(v))
    return found


def static_changes(snapshot: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """The entries of a ``static_snapshot`` whose object changed since."""
    return [(w, o, state) for w, o, state in snapshot if _static_state(o) != state]


def watch_callers(
    callers: Sequence[Any], objs: list, info: list, skip: frozenset[int] | set[int] = frozenset()
) -> dict[int | tuple[int, str], tuple[Any, tuple]]:
    """What each of the caller's containers (``callers``, per node of ``info``) that the
    function does not get itself (it gets ``objs``, rebuilt; nodes in ``skip`` are left out)
    holds one level down: it may reach the caller's through a global or a closure, and a
    change made there would be lost (rule J30). A registered node's flatten may read its
    children through a plain dict or list held in an attribute (``self._store["w"]``): such a
    container, when it holds one of the node's children, is watched too, under
    ``(node, attribute)``. :func:`check_callers` compares after."""
    watched: dict[int | tuple[int, str], tuple[Any, tuple]] = {}
    for k, e in enumerate(info):
        if k in skip or not isinstance(e, NodeInfo) or e.node_type is NoneType:
            continue
        obj = callers[k]
        if objs[k] is obj:
            continue
        watched[k] = (obj, shallow_state(obj))
        if e.arity and not isinstance(obj, (list, dict)):
            children = {id(callers[c]) for c in e.children}
            for name, value in list(getattr(obj, "__dict__", {}).items()):
                held = value.values() if isinstance(value, dict) else value
                if isinstance(value, (dict, list)) and any(id(v) in children for v in held):
                    watched[(k, name)] = (value, shallow_state(value))
    return watched


def check_callers(
    fun: Callable[..., Any],
    callers: Sequence[Any],
    watched: dict[int | tuple[int, str], tuple[Any, tuple]],
    pre_def: Any,
    objs: list,
    layout: Layout,
) -> None:
    """Rule J30's ValueError when ``fun`` changed one of the ``watched`` caller containers
    through another name than its argument; those containers are put back first."""
    touched = [key for key, (obj, state) in watched.items() if shallow_state(obj) != state]
    if touched:
        for key in touched:
            restore_shallow_state(*watched[key])
        raise_changed_elsewhere(fun, touched, pre_def, objs, layout)
