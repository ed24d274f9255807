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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from treeclone import _writeback
from treeclone._docs import see
from treeclone._policy_keys import complete_keys

__all__ = [
    "ALIAS",
    "CLONE",
    "ArgPolicies",
    "IDENTITY",
    "MUTATIONS",
    "PRESETS",
    "STRICT",
    "DISCARDED_MUTATIONS",
    "MutationError",
    "MutationWarning",
    "Policy",
    "as_policy",
    "as_policy_spec",
    "discarded_mode",
    "for_call",
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


def check_discarded_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`DISCARDED_MUTATIONS`, else a ValueError (what
    ``discarded_mutations=`` and :func:`set_discarded_mutations` check). Not in ``__all__``:
    for treeclone's own modules.

    >>> from treeclone.policies import check_discarded_mode
    >>> check_discarded_mode("off")
    'off'
    >>> check_discarded_mode("silent")
    Traceback (most recent call last):
    ...
    ValueError: discarded_mutations must be one of ('warn', 'error', 'off'), got 'silent' ...
    """
    if mode not in DISCARDED_MUTATIONS:
        raise ValueError(
            see(
                "invalid-option",
                f"discarded_mutations must be one of {DISCARDED_MUTATIONS}, got {mode!r}",
            )
        )
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
    previous, _discarded_default = _discarded_default, check_discarded_mode(mode)
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
    token = _discarded_block.set(check_discarded_mode(mode))
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
            raise ValueError(
                see(
                    "invalid-option",
                    f"mutations must be one of {MUTATIONS}, got {self.mutations!r}",
                )
            )
        if self.identity not in IDENTITY:
            raise ValueError(
                see("invalid-option", f"identity must be one of {IDENTITY}, got {self.identity!r}")
            )
        if self.identity == "duplicate" and self.mutations != "discard":
            # Writing back through duplicated objects has no single answer (two copies of one
            # object may be changed differently), and the mutation check needs identities.
            raise ValueError(
                see(
                    "invalid-option",
                    f"mutations={self.mutations!r} needs identity='preserve': with duplicated "
                    "objects a mutation cannot be traced back to one caller object",
                )
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
    ValueError: unknown policy 'copy'; expected one of ['alias', 'clone', 'strict'] or a Policy ...
    """
    if isinstance(policy, Policy):
        name = policy.name
        return policy if name is None else PRESETS[name]  # a preset is always the same object
    if isinstance(policy, str) and policy in PRESETS:
        return PRESETS[policy]
    raise ValueError(
        see(
            "invalid-option",
            f"unknown policy {policy!r}; expected one of {sorted(PRESETS)} or a Policy",
        )
    )


# What a mixed call runs with when some argument is ... (the strongest of its policies).
_DISCARD_PRESERVE = Policy("discard", "preserve")


def _combined(policies: Sequence[Policy]) -> Policy:
    """The policy a call whose arguments have ``policies`` runs under as a whole: ``alias``
    when one of them writes back, else ``strict`` when one of them checks, else
    ``Policy('discard', 'preserve')``; identity is preserved for every argument."""
    mutations = {p.mutations for p in policies}
    if "propagate" in mutations:
        return ALIAS
    if "error" in mutations:
        return STRICT
    return _DISCARD_PRESERVE


@dataclasses.dataclass(frozen=True)
class ArgPolicies:
    """A policy per argument: ``positions`` and ``names`` map each named argument to its
    policy (every position completed with its parameter's name and back, from the
    signature, as ``jax.jit`` completes ``static_argnums``/``static_argnames``), ``default``
    is the policy of the others. Made by :func:`as_policy_spec` from a dict such as
    ``{"model": "alias", "optimizer": "alias", ...: "clone"}``.

    >>> import treeclone
    >>> def step(model, optimizer, batch, cfg):
    ...     pass
    >>> spec = treeclone.policies.as_policy_spec({"model": "alias", 1: "alias"}, step)
    >>> spec
    ArgPolicies({0: 'alias', 1: 'alias', 'model': 'alias', 'optimizer': 'alias', ...: 'clone'})
    >>> spec.per_argument([0, 1, 2], ["cfg"])
    (Policy.alias, Policy.alias, Policy.clone, Policy.clone)
    """

    positions: tuple[tuple[int, Policy], ...]
    names: tuple[tuple[str, Policy], ...]
    default: Policy
    # The dict gave no ``...``: the default is for data no named argument holds, so a
    # container of another argument that a named one also holds follows the named one (rule
    # P5) instead of being rule P4's error.
    implicit_default: bool = dataclasses.field(default=False, compare=True)

    @property
    def name(self) -> None:
        """Not a preset (for messages that name a policy).

        >>> import treeclone
        >>> treeclone.policies.as_policy_spec({0: "alias"}, lambda a, b: None).name is None
        True
        """
        return None

    @property
    def mutations(self) -> str:
        """The mutations of the policy a call runs under when every policy given is used.

        >>> import treeclone
        >>> treeclone.policies.as_policy_spec({0: "strict"}, lambda a, b: None).mutations
        'error'
        """
        return _combined(self.policies()).mutations

    @property
    def identity(self) -> str:
        """Always ``"preserve"``: a call mixing policies keeps one object per object.

        >>> import treeclone
        >>> treeclone.policies.as_policy_spec({0: "alias"}, lambda a, b: None).identity
        'preserve'
        """
        return "preserve"

    def policies(self) -> list[Policy]:
        """Every policy this names, the default first.

        >>> import treeclone
        >>> treeclone.policies.as_policy_spec({"b": "alias"}, lambda a, b: None).policies()
        [Policy.clone, Policy.alias, Policy.alias]
        """
        return [self.default, *(p for _, p in self.positions), *(p for _, p in self.names)]

    def per_argument(self, positions: Sequence[int], names: Sequence[str]) -> tuple[Policy, ...]:
        """The policy of each argument of a call: the positional ones at ``positions`` (their
        places in the call), then the keyword arguments ``names``.

        >>> import treeclone
        >>> spec = treeclone.policies.as_policy_spec({"b": "alias"}, lambda a, b: None)
        >>> spec.per_argument([0], ["b"])
        (Policy.clone, Policy.alias)
        """
        by_position, by_name = dict(self.positions), dict(self.names)
        return tuple(by_position.get(i, self.default) for i in positions) + tuple(
            by_name.get(k, self.default) for k in names
        )

    def named(self, positions: Sequence[int], names: Sequence[str]) -> tuple[bool, ...] | None:
        """Per argument of a call (as :meth:`per_argument`), whether the dict names it; None
        when the dict gave ``...`` (every argument's policy was chosen).

        >>> import treeclone
        >>> spec = treeclone.policies.as_policy_spec({"b": "alias"}, lambda a, b: None)
        >>> spec.named([0], ["b"])
        (False, True)
        """
        if not self.implicit_default:
            return None
        by_position, by_name = dict(self.positions), dict(self.names)
        return tuple(i in by_position for i in positions) + tuple(k in by_name for k in names)

    def __repr__(self) -> str:
        def show(p: Policy) -> str:
            return repr(p.name) if p.name is not None else repr(p)

        items = [f"{k!r}: {show(p)}" for k, p in (*self.positions, *self.names)]
        return "ArgPolicies({" + ", ".join([*items, f"...: {show(self.default)}"]) + "})"


PolicySpec = str | Policy | Mapping[Any, str | Policy]
"""What ``policy=`` takes: a policy for every argument, or a dict of them per argument."""


def as_policy_spec(
    policy: PolicySpec | ArgPolicies, fun: Callable[..., Any], default: str | Policy = "clone"
) -> Policy | ArgPolicies:
    """``policy=`` of ``fun`` made canonical: a :class:`Policy` (:func:`as_policy`), or for a
    dict, the :class:`ArgPolicies` it says. The dict's keys are argument positions (``int``,
    negative ones counted from the end of the positional parameters) and names (``str``),
    and ``...`` for every other argument (``default`` when absent: ``clone`` for ``jit`` and
    ``call``). Checked at once against ``fun``'s signature: an unknown name, a position
    beyond the parameters (unless ``fun`` takes ``*args``), or a position and its name given
    two policies are ValueErrors. A dict whose policies are all one policy is that policy.

    >>> import treeclone
    >>> from treeclone.policies import as_policy_spec
    >>> def step(params, batch):
    ...     pass
    >>> as_policy_spec({"params": "alias", ...: "alias"}, step)
    Policy.alias
    >>> as_policy_spec({"parms": "alias"}, step)
    Traceback (most recent call last):
    ...
    ValueError: policy names 'parms', which is not an argument of step (params, batch) ...
    >>> as_policy_spec({0: "alias", "params": "strict"}, step)
    Traceback (most recent call last):
    ...
    ValueError: policy gives argument 0 (params) two policies: Policy.alias and Policy.strict ...
    """
    if isinstance(policy, ArgPolicies):
        return policy
    if not isinstance(policy, Mapping):
        return as_policy(policy)
    fallback = as_policy(default)
    by_position: dict[int, Policy] = {}
    by_name: dict[str, Policy] = {}
    for key, value in policy.items():
        chosen = as_policy(value)
        if key is Ellipsis:
            fallback = chosen
        elif isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(
                see(
                    "policy-argument",
                    f"policy's keys are argument positions (int), names (str) and ... (every "
                    f"other argument), got {key!r}",
                )
            )
        elif isinstance(key, int):
            by_position[key] = chosen
        else:
            by_name[key] = chosen
    complete_keys(by_position, by_name, fun)
    spec = ArgPolicies(
        tuple(sorted(by_position.items())),
        tuple(sorted(by_name.items())),
        fallback,
        Ellipsis not in policy,
    )
    if all(p is fallback for p in spec.policies()):
        return fallback
    return spec


def for_call(
    policy: Policy | ArgPolicies, positions: Sequence[int], names: Sequence[str]
) -> tuple[Policy, tuple[Policy, ...] | None]:
    """What one call runs under: its arguments at ``positions`` (their places in the
    function's signature) and its keyword arguments ``names``. Returns the policy of the call
    as a whole and, when its arguments' policies differ, each one's (``_effects.Request``'s
    ``arg_policies``; None: the one policy for all). Every transformation that takes a dict
    resolves a call here, so a dict means the same to each.

    >>> import treeclone
    >>> from treeclone.policies import as_policy_spec, for_call
    >>> spec = as_policy_spec({"state": "alias", ...: "clone"}, lambda params, state: None)
    >>> for_call(spec, [0, 1], [])
    (Policy.alias, (Policy.clone, Policy.alias))
    >>> for_call(spec, [0], [])  # only clone arguments: identity is still preserved
    (Policy(mutations='discard', identity='preserve'), None)
    >>> for_call(treeclone.STRICT, [0, 1], [])
    (Policy.strict, None)
    """
    if not isinstance(policy, ArgPolicies):
        return policy, None
    per_argument = policy.per_argument(positions, names)
    return _combined(per_argument), per_argument if len(set(per_argument)) > 1 else None


# The policy of the innermost ``with policy(...)`` block (None: none). Set only by
# :func:`policy`; read at every call of jit, jit_partial and the lifted transformations
# (``policy_override.get() or ...``: one lookup of this module global). Not in ``__all__``.
policy_override: contextvars.ContextVar[Policy | None] = contextvars.ContextVar(
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
    token = policy_override.set(chosen)
    try:
        yield chosen
    finally:
        policy_override.reset(token)


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
        raise TypeError(see("invalid-option", f"register_inplace expects a class, got {cls!r}"))
    _writeback.set_updater(cls, update)
