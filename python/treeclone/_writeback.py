"""Writing a call's results back into the caller's custom nodes, in place (policy ``alias``).

The native write-back (``CallPlan.apply``) updates lists and dicts itself; for custom nodes and
namedtuples it calls :func:`write_custom`, which ``_trace`` hands to ``CallPlan``. Tracing asks
:func:`writable` whether a custom node can be updated in place or must be rebuilt and re-set.
Hooks for particular classes come from ``treeclone.register_inplace``.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

_UPDATERS: dict[type, Callable[[Any, Any], None]] = {}


def set_updater(cls: type, update: Callable[[Any, Any], None]) -> None:
    """Use ``update(target, source)`` for instances of ``cls`` (``policies.register_inplace``)."""
    _UPDATERS[cls] = update
    _FIELD_NAMES.clear()


def writable(obj: Any) -> bool:
    """Whether a custom node can be updated in place (else it is rebuilt and re-set)."""
    cls = type(obj)
    if cls in _UPDATERS or isinstance(obj, (dict, list)):
        return True
    if isinstance(obj, tuple):
        return False
    return dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__") or bool(_slots_of(cls))


def has_updater(obj: Any) -> bool:
    """Whether ``register_inplace`` gave ``obj``'s class its own update hook."""
    return type(obj) in _UPDATERS


def attribute_names(obj: Any) -> list[str]:
    """The instance attributes of ``obj`` that write-back may set."""
    names = list(getattr(obj, "__dict__", ()))
    names.extend(_slots_of(type(obj)))
    if isinstance(obj, collections.defaultdict):
        names.append("default_factory")
    return names


def _same(a: Any, b: Any) -> bool:
    """Identity, or equality for plain values; an ``==`` that raises or is not a bool (arrays,
    tracers) counts as different."""
    if a is b:
        return True
    try:
        equal = a == b
    except Exception:
        return False
    return equal if isinstance(equal, bool) else False


def changed_attributes(before: Any, after: Any) -> tuple[str, ...]:
    """The attributes whose values differ between two objects of the same class.

    Used at trace time with ``before`` and ``after`` both rebuilt by the node's unflatten (from
    the caller's contents and from the function's results): what differs is exactly what the
    function changed through the pytree, and write-back sets only that, never the state the
    flatten does not carry (an attribute it leaves out, a dataclass's ``drop_fields``).
    """
    missing = object()
    names = dict.fromkeys([*attribute_names(before), *attribute_names(after)])
    return tuple(
        n for n in names if not _same(getattr(before, n, missing), getattr(after, n, missing))
    )


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    return names


# Per class, held weakly: a dataclass's field names (None: not a dataclass), its slots.
_FIELD_NAMES: weakref.WeakKeyDictionary[type, tuple[str, ...] | None] = weakref.WeakKeyDictionary()
_SLOTS: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _field_names(cls: type) -> tuple[str, ...] | None:
    """A dataclass's field names (assigned one by one), or None: copy the instance attributes."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        pass
    names = None
    if dataclasses.is_dataclass(cls):
        names = tuple(f.name for f in dataclasses.fields(cls))
    _FIELD_NAMES[cls] = names
    return names


def _slots_of(cls: type) -> tuple[str, ...]:
    found = _SLOTS.get(cls)
    if found is None:
        found = _SLOTS[cls] = tuple(_slot_names(cls))
    return found


def write_custom(target: Any, source: Any, attrs: tuple[str, ...] | None) -> Callable[[], None]:
    """Give ``target`` the state of ``source`` in place; return a function that undoes it.

    Called by the native write-back (``CallPlan.apply``) for custom nodes (a dict or list
    subclass has had its items written already). ``attrs`` names the attributes to set (from
    :func:`changed_attributes` at trace time); None sets every field or attribute of
    ``source``. A ``register_inplace`` hook replaces all of this; if it raises, the object is
    put back as it was before the exception propagates.
    """
    cls = type(target)
    update = _UPDATERS.get(cls)
    if update is not None:
        before = copy.copy(target)
        try:
            update(target, source)
        except BaseException:
            update(target, before)
            raise
        return lambda: update(target, before)
    names = attrs
    if names is None:
        names = _field_names(cls)
    if names is None:
        names = (*getattr(source, "__dict__", ()), *_slots_of(cls))
    missing = object()
    before = [(name, getattr(target, name, missing)) for name in names]
    # object.__setattr__: frozen dataclasses are updated too (alias means "as if the function
    # had run on the caller's object", and that object changed).
    setattr_ = object.__setattr__

    def undo() -> None:
        for name, value in before:
            if value is missing:
                try:
                    object.__delattr__(target, name)
                except AttributeError:
                    pass
            else:
                setattr_(target, name, value)

    try:
        for name in names:
            value = getattr(source, name, missing)
            if value is not missing:
                setattr_(target, name, value)
    except BaseException:
        undo()
        raise
    return undo
