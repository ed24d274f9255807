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

>>> import treeclone
>>> treeclone.policies.as_policy("alias")
Policy.alias
>>> treeclone.Policy(mutations="error", identity="preserve")
Policy.strict
>>> treeclone.Policy(mutations="propagate", identity="duplicate")
Traceback (most recent call last):
...
ValueError: mutations='propagate' needs identity='preserve': ...
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from treeclone import _writeback

__all__ = [
    "ALIAS",
    "CLONE",
    "IDENTITY",
    "MUTATIONS",
    "PRESETS",
    "STRICT",
    "DISCARDED_MUTATIONS",
    "MutationError",
    "MutationWarning",
    "Policy",
    "as_policy",
    "discarded_mode",
    "discarded_mutations",
    "policy",
    "register_inplace",
    "set_discarded_mutations",
]

MUTATIONS: tuple[str, ...] = ("discard", "propagate", "error")
"""The values of :attr:`Policy.mutations`."""
IDENTITY: tuple[str, ...] = ("duplicate", "preserve")
"""The values of :attr:`Policy.identity`."""


class MutationError(ValueError):
    """A function run under the ``strict`` policy mutated an input it does not return.

    The message names the argument and the key path of each mutated container.

    >>> import treeclone
    >>> def f(x):
    ...     x.append(1.0)
    >>> treeclone.call(f, [], policy="strict")
    Traceback (most recent call last):
    ...
    treeclone.policies.MutationError: ...
    """


class MutationWarning(UserWarning):
    """A function run under ``clone`` changed an input in place without returning it.

    ``clone`` discards such changes, as ``jax.jit`` does: the caller's objects keep their old
    values (an ``optimizer.update(...)`` whose optimizer is not returned trains nothing).
    Issued once per trace, naming the function and the key paths; see
    :func:`set_discarded_mutations` to make it an error or silence it.

    >>> import warnings, jax.numpy as jnp, treeclone
    >>> def step(state):
    ...     state["n"] = state["n"] + 1
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     treeclone.jit(step)({"n": jnp.zeros(())})
    >>> print(caught[0].message)
    step changed its inputs in place without returning them; under policy 'clone' ...
      state['n']: replaced
    ...
    """


DISCARDED_MUTATIONS: tuple[str, ...] = ("warn", "error", "off")
"""What :func:`set_discarded_mutations` and ``discarded_mutations=`` take."""
_discarded_default = "warn"
_discarded_block: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "treeclone_discarded_mutations", default=None
)


def _check_discarded_mode(mode: str) -> str:
    if mode not in DISCARDED_MUTATIONS:
        raise ValueError(f"discarded_mutations must be one of {DISCARDED_MUTATIONS}, got {mode!r}")
    return mode


def set_discarded_mutations(mode: str) -> str:
    """Set what a function run under ``clone`` that changes an input in place without returning
    it gets, everywhere (``jit``, ``call`` and each transformation); returns the previous mode.

    ``"warn"`` (the default): a :class:`MutationWarning` at each trace that discards a change;
    ``"error"``: the :class:`MutationError` ``strict`` raises; ``"off"``: nothing, as
    ``jax.jit``. ``treeclone.jit(f, discarded_mutations=...)`` chooses for one function and
    a ``with treeclone.discarded_mutations(...)`` block for the calls inside it, which wins.

    >>> import treeclone
    >>> previous = treeclone.set_discarded_mutations("error")
    >>> previous
    'warn'
    >>> treeclone.set_discarded_mutations(previous)
    'error'
    """
    global _discarded_default
    previous, _discarded_default = _discarded_default, _check_discarded_mode(mode)
    return previous


@contextlib.contextmanager
def discarded_mutations(mode: str) -> Iterator[str]:
    """Within the block, a discarded in-place change is ``mode`` (``"warn"``, ``"error"`` or
    ``"off"``: see :func:`set_discarded_mutations`), whatever a function was wrapped with.

    >>> import jax.numpy as jnp, treeclone
    >>> def grow(xs):
    ...     xs.append(jnp.ones(()))
    >>> with treeclone.discarded_mutations("error"):
    ...     treeclone.call(grow, [])
    Traceback (most recent call last):
    ...
    treeclone.policies.MutationError: grow changed its inputs in place without returning ...
    """
    token = _discarded_block.set(_check_discarded_mode(mode))
    try:
        yield mode
    finally:
        _discarded_block.reset(token)


def discarded_mode(mode: str | None = None) -> str:
    """What a discarded change gets now, for a function wrapped with ``mode`` (None: not
    chosen): a ``with discarded_mutations(...)`` block's mode, else ``mode``, else the global
    one (:func:`set_discarded_mutations`).

    >>> import treeclone
    >>> from treeclone.policies import discarded_mode
    >>> discarded_mode(), discarded_mode("off")
    ('warn', 'off')
    >>> with treeclone.discarded_mutations("error"):
    ...     discarded_mode("off")
    'error'
    """
    return _discarded_block.get() or mode or _discarded_default


@dataclasses.dataclass(frozen=True)
class Policy:
    """A choice on both axes (see the module docstring); invalid combinations are refused.

    >>> import treeclone
    >>> treeclone.Policy()  # the default is clone, what jax.jit does
    Policy.clone
    >>> treeclone.Policy(mutations="propagate", identity="preserve")
    Policy.alias
    >>> treeclone.Policy(mutations="discard", identity="preserve")
    Policy(mutations='discard', identity='preserve')
    """

    mutations: str = "discard"
    """What happens to in-place changes of inputs: one of :data:`MUTATIONS`."""
    identity: str = "duplicate"
    """Whether shared objects stay shared: one of :data:`IDENTITY`."""

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
        """The preset's name, or None for another combination.

        >>> from treeclone import ALIAS, Policy
        >>> ALIAS.name
        'alias'
        >>> Policy("discard", "preserve").name is None
        True
        """
        return _NAMES.get((self.mutations, self.identity))

    def __repr__(self) -> str:
        if self.name is not None:
            return f"Policy.{self.name}"
        return f"Policy(mutations={self.mutations!r}, identity={self.identity!r})"


CLONE: Policy = Policy("discard", "duplicate")
"""``discard``/``duplicate``: exactly what ``jax.jit`` does."""
ALIAS: Policy = Policy("propagate", "preserve")
"""``propagate``/``preserve``: the function behaves as it would without jit."""
STRICT: Policy = Policy("error", "preserve")
"""``error``/``preserve``: a mutated input that is not returned is a :class:`MutationError`."""
PRESETS: dict[str, Policy] = {"clone": CLONE, "alias": ALIAS, "strict": STRICT}
"""The presets by name."""
_NAMES = {(p.mutations, p.identity): name for name, p in PRESETS.items()}


def as_policy(policy: str | Policy) -> Policy:
    """A :class:`Policy` from a preset name or a Policy; a preset is always the same object.

    >>> from treeclone import CLONE, Policy
    >>> from treeclone.policies import as_policy
    >>> as_policy("clone") is as_policy(Policy()) is CLONE
    True
    >>> as_policy("copy")
    Traceback (most recent call last):
    ...
    ValueError: unknown policy 'copy'; expected one of ['alias', 'clone', 'strict'] or a Policy
    """
    if isinstance(policy, Policy):
        name = policy.name
        return policy if name is None else PRESETS[name]  # a preset is always the same object
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

    >>> import treeclone
    >>> def append_one(xs):
    ...     xs.append(1.0)
    >>> jitted = treeclone.jit(append_one)  # clone: the caller's list is not changed
    >>> xs = []
    >>> jitted(xs)
    >>> xs
    []
    >>> with treeclone.policy("alias") as chosen:
    ...     jitted(xs)
    >>> chosen, xs
    (Policy.alias, [Array(1., dtype=float32, weak_type=True)])
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

    >>> import jax, treeclone
    >>> class Box:
    ...     def __init__(self, value):
    ...         self.value = value
    >>> jax.tree_util.register_pytree_node(Box, lambda b: ((b.value,), None), lambda _, c: Box(*c))
    >>> def update(target, source):
    ...     print("update")
    ...     target.value = source.value
    >>> treeclone.register_inplace(Box, update)
    >>> def bump(box):
    ...     box.value = box.value + 1
    >>> b = Box(1.0)
    >>> treeclone.jit(bump, policy="alias")(b)
    update
    >>> b.value
    Array(2., dtype=float32, weak_type=True)
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_inplace expects a class, got {cls!r}")
    _writeback.set_updater(cls, update)
