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
from collections.abc import Callable, Iterator
from typing import Any

from treeclone import _writeback

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
    _writeback.set_updater(cls, update)
