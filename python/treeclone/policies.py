"""Policies: what a call does with in-place mutations of its inputs, and with object identity.

A :class:`Policy` has two independent axes:

* ``mutations``: what happens to in-place changes the function makes to its input containers:
  ``"discard"`` (the caller never sees them), ``"propagate"`` (they are applied to the caller's
  objects after the call) or ``"error"`` (a mutation of an input the function does not return
  raises :class:`MutationError` naming its key path);
* ``identity``: ``"duplicate"`` (every occurrence of a shared object becomes its own copy, as
  ``jax.jit`` does) or ``"preserve"`` (the function sees shared objects shared, ``a is b`` as
  in plain Python, and a shared array is one input to the computation).

Three presets have names: ``clone`` (``discard``/``duplicate``: exactly ``jax.jit``),
``alias`` (``propagate``/``preserve``: the function behaves as it would without jit) and
``strict`` (``error``/``preserve``). ``docs/semantics.md`` states every rule.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

MUTATIONS = ("discard", "propagate", "error")
IDENTITY = ("duplicate", "preserve")


class MutationError(ValueError):
    """A function run under the ``strict`` policy mutated an input it does not return."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """A choice on both axes (see the module docstring)."""

    mutations: str = "discard"
    identity: str = "duplicate"

    def __post_init__(self) -> None:
        if self.mutations not in MUTATIONS:
            raise ValueError(f"mutations must be one of {MUTATIONS}, got {self.mutations!r}")
        if self.identity not in IDENTITY:
            raise ValueError(f"identity must be one of {IDENTITY}, got {self.identity!r}")
        if self.identity == "duplicate" and self.mutations != "discard":
            # Writing back through duplicated objects has no single answer (two copies of one
            # object may be changed differently), and the mutation check needs identities.
            raise ValueError(
                f"mutations={self.mutations!r} needs identity='preserve': with duplicated "
                "objects a mutation cannot be traced back to one caller object"
            )

    @property
    def name(self) -> str | None:
        """The preset's name, or None for another combination."""
        return _NAMES.get((self.mutations, self.identity))

    def __repr__(self) -> str:
        if self.name is not None:
            return f"Policy.{self.name}"
        return f"Policy(mutations={self.mutations!r}, identity={self.identity!r})"


CLONE = Policy("discard", "duplicate")
ALIAS = Policy("propagate", "preserve")
STRICT = Policy("error", "preserve")
PRESETS = {"clone": CLONE, "alias": ALIAS, "strict": STRICT}
_NAMES = {(p.mutations, p.identity): name for name, p in PRESETS.items()}


def as_policy(policy: str | Policy) -> Policy:
    """A :class:`Policy` from a preset name or a Policy."""
    if isinstance(policy, Policy):
        return PRESETS.get(policy.name, policy)  # a preset is always the same object
    if isinstance(policy, str) and policy in PRESETS:
        return PRESETS[policy]
    raise ValueError(f"unknown policy {policy!r}; expected one of {sorted(PRESETS)} or a Policy")


_override: contextvars.ContextVar[Policy | None] = contextvars.ContextVar(
    "treeclone_policy", default=None
)


@contextlib.contextmanager
def policy(p: str | Policy) -> Iterator[Policy]:
    """Within the block, every ``treeclone.jit`` call uses policy ``p``.

    It overrides the policy a function was wrapped with; ``jitted.with_policy(...)`` calls
    made inside the block are overridden too (the innermost ``with`` wins).
    """
    chosen = as_policy(p)
    token = _override.set(chosen)
    try:
        yield chosen
    finally:
        _override.reset(token)


def current_override() -> Policy | None:
    """The policy set by the innermost enclosing ``with treeclone.policy(...)``, if any."""
    return _override.get()


# --- in-place updates of custom nodes -------------------------------------------------------

_UPDATERS: dict[type, Callable[[Any, Any], None]] = {}


def register_inplace(cls: type, update: Callable[[Any, Any], None]) -> None:
    """Let instances of ``cls`` be updated in place under ``alias``.

    ``update(target, source)`` must make ``target`` (the caller's object) equal to ``source``
    (a new instance rebuilt from the updated children). It is also used to undo a write-back
    that failed elsewhere, with a shallow copy of the target taken before, so it must accept
    any instance of ``cls`` as ``source``. Without a hook, dataclasses get their fields assigned
    and other objects their instance attributes (``__dict__`` and ``__slots__``).
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_inplace expects a class, got {cls!r}")
    _UPDATERS[cls] = update
    _field_names.cache_clear()


def writable(obj: Any) -> bool:
    """Whether a custom node can be updated in place (else it is rebuilt and re-set)."""
    cls = type(obj)
    if cls in _UPDATERS:
        return True
    if isinstance(obj, tuple):
        return False
    return dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__") or bool(_slots_of(cls))


def _slot_names(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    return names


@functools.cache
def _field_names(cls: type) -> tuple[str, ...] | None:
    """A dataclass's field names (assigned one by one), or None: copy the instance attributes."""
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return None


@functools.cache
def _slots_of(cls: type) -> tuple[str, ...]:
    return tuple(_slot_names(cls))


def write_custom(target: Any, source: Any) -> Callable[[], None]:
    """Give ``target`` the state of ``source`` in place; return a function that undoes it.

    Called by the native write-back (``CallPlan.apply``) for custom nodes and namedtuples.
    """
    cls = type(target)
    update = _UPDATERS.get(cls)
    if update is not None:
        import copy

        before = copy.copy(target)
        update(target, source)
        return lambda: update(target, before)
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
