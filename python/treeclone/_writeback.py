"""Writing a call's results back into the caller's custom nodes, in place (policy ``alias``).

The native write-back (``CallPlan.apply``) updates lists and dicts itself; for custom nodes and
namedtuples it calls :func:`write_custom`, which ``_effects`` hands to ``CallPlan``. Tracing asks
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


class InPlace(str):
    """An attribute name for :func:`write_custom` whose plain dict or list the function changed
    in place (it held the same container after the call, ``_effects.writes``): write-back
    updates the caller's container there, entry by entry, instead of setting the attribute to
    a new one, so that another reference to that container (``ref = obj.d``) sees the change,
    as in plain Python."""

    __slots__ = ()


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
    missing: Any = object()
    before = [(name, getattr(target, name, missing)) for name in names]
    # object.__setattr__: frozen dataclasses are updated too (alias means "as if the function
    # had run on the caller's object", and that object changed).
    setattr_ = object.__setattr__

    def set_back() -> None:
        for name, value in before:
            if value is missing:
                try:
                    object.__delattr__(target, name)
                except AttributeError:
                    pass
            else:
                setattr_(target, name, value)

    updated: list[Callable[[], None]] = []  # the containers updated in place, to undo

    def undo() -> None:
        for put_back in reversed(updated):
            put_back()
        set_back()

    try:
        for name in names:
            value = getattr(source, name, missing)
            if value is missing:
                continue
            if isinstance(name, InPlace):
                current: Any = getattr(target, name, missing)
                if type(current) is type(value) and type(value) in (dict, list):
                    updated.append(_update_container(current, value))
                    continue
            setattr_(target, name, value)
    except BaseException:
        undo()
        raise
    return undo


def _update_container(target: dict | list, source: dict | list) -> Callable[[], None]:
    """Give the plain dict or list ``target`` the entries of ``source`` (of its type) in place,
    setting only those that differ (a dict's kept keys keep their place, new ones follow in
    ``source``'s order); return a function that puts its old entries back."""
    if isinstance(target, dict):
        assert isinstance(source, dict)
        old_items = list(target.items())
        for key in [k for k in target if k not in source]:
            del target[key]
        missing = object()
        for key, value in source.items():
            if target.get(key, missing) is not value:
                target[key] = value
        if list(target) != list(source):  # the function reordered its keys
            target.clear()
            target.update(source)

        def put_back_dict() -> None:
            target.clear()
            target.update(old_items)

        return put_back_dict
    assert isinstance(source, list)
    old_list = list(target)
    for i, value in enumerate(source[: len(target)]):
        if target[i] is not value:
            target[i] = value
    if len(source) > len(target):
        target.extend(source[len(target) :])
    elif len(source) < len(target):
        del target[len(source) :]

    def put_back_list() -> None:
        target[:] = old_list

    return put_back_list
