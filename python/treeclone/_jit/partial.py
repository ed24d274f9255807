"""``treeclone.jit_partial``: a jitted function with its first arguments bound and flattened once.

A training step called as ``step(model, optimizer, x, y)`` flattens the model and optimizer at
every call; for flax nnx modules that is one Python flatten per module and per Variable, most
of a small step's cost. ``jit_partial(step, model, optimizer, policy="alias")`` flattens them
once, keeps their leaves, and at each call flattens only ``x`` and ``y``.

What keeps the cached leaves right (docs/semantics.md, "jit_partial"):

- the call's own write-back knows where every leaf of the bound arguments went (the trace
  records it), so the cache follows the function's updates without flattening again; a call
  that changes their structure (a key added, a list grown) flattens them again afterwards;
- before each call, a ``Snapshot`` of the bound containers (their items and instance
  attributes, by identity, compared in Rust) tells whether code outside the function changed
  them since; if so they are flattened again, so such a change is used, never lost. After a
  call the snapshot follows the write-back from the call's own record of the bound leaves,
  reading nothing from the containers, so what another thread wrote into them during the
  call is seen at the next;
- an argument of the call that is also reachable from the bound arguments (``step(model.layer)``
  with ``model`` bound) makes that call flatten everything together, so sharing is preserved;
- a call that replaced containers of the bound arguments (``state["params"] = new_dict``, as
  an optax step does) leaves the caller holding containers the cache does not: the next call
  flattens everything together, as ``jit`` does (flattening the bound arguments after the call
  and the others at the next would cost more than ``jit``), and caching resumes after a call
  that replaces none;
- the bound arguments are flattened and their snapshot taken in one native call, with the
  cyclic GC paused: neither another thread nor a finalizer run at an allocation can change a
  container after the flatten read it and before the snapshot recorded it (the snapshot would
  then hold a change the cache never saw); the finalizers run after, and their changes are
  seen at the next call. A registered flatten written in Python runs Python code in between,
  where another thread can run: the take checks what it can of that window (each dict's and
  list's record against the flatten's children, attribute dicts by their versions), and
  docs/semantics.md says what stays open.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from treeclone import _native
from treeclone._docs import see
from treeclone._jit.bound import BoundArguments
from treeclone._jit.jitted import Jitted, jit
from treeclone._jit.options import parameters
from treeclone.policies import ArgPolicies, Policy, PolicySpec, as_policy_spec, policy_override


class JitPartial(_native.PartialCore):
    """What :func:`jit_partial` returns: call it with the remaining arguments.

    >>> import jax.numpy as jnp, treeclone
    >>> def scale(params, x):
    ...     "Multiply x by params['w']."
    ...     return params["w"] * x
    >>> scaled = treeclone.jit_partial(scale, {"w": jnp.array([3.0, 3.0])})
    >>> scaled.__name__, scaled.__doc__
    ('scale', "Multiply x by params['w'].")
    >>> scaled(2.0)
    Array([6., 6.], dtype=float32)
    """

    def __init__(self, jitted: Jitted, bound: tuple):
        self._jitted = jitted
        self._jit = jit = jitted.interface()
        functools.update_wrapper(self, jit.fun)
        if jit.static_nums & set(range(len(bound))):
            raise ValueError(
                see(
                    "jit-partial", "jit_partial: a bound argument cannot be static (static_argnums)"
                )
            )
        self._bound = BoundArguments(bound, jit.naming)
        # The native base's __call__ takes jit's native call while the bound containers are
        # replaced at every call (nothing cached then), else the same with the bound arguments'
        # cache, under a policy _call_bound checked; _call_bound otherwise.
        self._init_partial(jitted, self._bound.args, self._bound)

    @property
    def policy(self) -> Policy | ArgPolicies:
        """The policy calls use (unless a ``with treeclone.policy(...)`` block overrides it).

        >>> import treeclone
        >>> treeclone.jit_partial(lambda s: s, {}, policy="strict").policy
        Policy.strict
        """
        return self._jitted.policy

    def _call_bound(self, *args: Any, **kwargs: Any) -> Any:
        """``fun(*bound, *args, **kwargs)``, compiled, under the policy, with the cache of the
        bound arguments: a call under a policy the native base has not checked yet (it must
        preserve identity); the native base learns whether the call replaced bound
        containers."""
        try:
            policy = policy_override.get() or self._jit.policy
            _check_policy(policy)
            self._checked(policy)  # the native base's next calls under it need no check
            return self._call_checked(args, kwargs)
        finally:
            self._after_call()

    def _after_call(self) -> None:
        """Tell the native base whether the last call replaced bound containers."""
        self._set_replaced(self._bound.replaced)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``fun`` lowered for the bound arguments and these (see
        :meth:`treeclone.Jitted.lower`): compiled, it is called with the remaining arguments
        and writes back into the bound ones as a call does.

        >>> import jax.numpy as jnp, treeclone
        >>> def accumulate(state, x):
        ...     state["total"] = state["total"] + x
        ...     return state["total"]
        >>> state = {"total": jnp.zeros(())}
        >>> compiled = treeclone.jit_partial(accumulate, state).lower(1.0).compile()
        >>> compiled(1.0), compiled(2.0)
        (Array(1., dtype=float32), Array(3., dtype=float32))
        >>> state
        {'total': Array(3., dtype=float32)}
        """
        return self._stage("lower", args, kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """``fun`` traced for the bound arguments and these (see :meth:`lower`).

        >>> import jax.numpy as jnp, treeclone
        >>> total = treeclone.jit_partial(lambda s, x: s["w"].sum() * x, {"w": jnp.ones(2)})
        >>> total.trace(3.0).out_info
        ShapeDtypeStruct(shape=(), dtype=float32)
        """
        return self._stage("trace", args, kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The shapes of ``fun``'s outputs for the bound arguments and these; nothing is
        written back.

        >>> import jax.numpy as jnp, treeclone
        >>> def push(state, x):
        ...     state["xs"].append(x)
        ...     return x * 2
        >>> state = {"xs": []}
        >>> treeclone.jit_partial(push, state).eval_shape(jnp.ones(3))
        ShapeDtypeStruct(shape=(3,), dtype=float32)
        >>> state
        {'xs': []}
        """
        return self._stage("eval_shape", args, kwargs)

    def _stage(self, method: str, args: tuple, kwargs: dict) -> Any:
        _check_policy(policy_override.get() or self._jit.policy)
        bound = self._bound
        try:
            return self._jit.stage(method, (*bound.args, *args), kwargs, bound, self)
        finally:
            self._after_call()

    def _resume(self) -> None:
        """After a call on the native path (``PartialCore``) that replaced no bound container:
        flatten the bound arguments again, so that the next call uses the cache."""
        self._bound.flatten()
        self._set_replaced(False)

    def clear_cache(self) -> None:
        """Empty the compiled-code caches (see :meth:`treeclone.Jitted.clear_cache`).

        >>> import jax.numpy as jnp, treeclone
        >>> total = treeclone.jit_partial(lambda s, x: s["w"].sum() + x, {"w": jnp.ones(2)})
        >>> _ = total(1.0)
        >>> total.clear_cache()
        >>> total._cache_size()
        0
        """
        self._jitted.clear_cache()

    def _cache_size(self) -> int:
        """The compiled entries calls can reuse, one per structure of the call's arguments.

        >>> import jax.numpy as jnp, treeclone
        >>> total = treeclone.jit_partial(lambda s, x: s["w"].sum() + x, {"w": jnp.ones(2)})
        >>> _ = total(1.0), total(2.0), total(jnp.ones(3))
        >>> total._cache_size()
        2
        """
        return self._jit.cache_size()

    def __repr__(self) -> str:
        return f"<treeclone.jit_partial of {self._jit.fun!r} (policy {self.policy!r})>"


def _check_policy(policy: Policy | ArgPolicies) -> None:
    if policy.identity != "preserve":
        raise ValueError(
            see(
                "jit-partial",
                f"jit_partial needs a policy that preserves identity (alias, strict, or "
                f"Policy('discard', 'preserve')), got {policy!r}: under clone, call "
                f"treeclone.jit(fun)(*bound, *args)",
            )
        )


def jit_partial(
    fun: Callable[..., Any],
    /,
    *bound: Any,
    policy: PolicySpec | None = None,
    **jit_options: Any,
) -> JitPartial:
    """``treeclone.jit(fun, policy=..., ...)`` with ``bound`` as its first arguments, flattened
    once: the callable returned takes the remaining ones. Write-back under ``alias`` goes into
    the bound objects themselves, exactly as ``treeclone.jit(fun)(*bound, *args)`` would;
    ``jit_options`` are :func:`treeclone.jit`'s, checked by it (argument numbers count the
    bound arguments).

    By default the bound arguments are ``alias`` and the call's own arguments ``clone``: a
    step updates its model and optimizer in place, and what it changes in place in a batch it
    is given is discarded, with a :class:`treeclone.MutationWarning` at the trace (as
    ``nnx.jit_partial`` propagates only what it binds), so the caller's batch is never
    rewritten without a word. A policy (``"alias"``, ``"strict"``) applies to every argument,
    as for :func:`treeclone.jit`. A dict gives a policy per argument; of the arguments it does
    not name, the bound ones are ``alias`` and the others ``clone``, unless its ``...`` says
    otherwise. The policy must preserve identity (not ``clone`` for all). Changes made to the
    bound objects between calls are seen (docs/semantics.md, "jit_partial").

    >>> import jax.numpy as jnp, treeclone
    >>> def accumulate(state, x):
    ...     state["total"] = state["total"] + x
    ...     return state["total"]
    >>> state = {"total": jnp.zeros(())}
    >>> add = treeclone.jit_partial(accumulate, state)
    >>> add(1.0), add(2.0)
    (Array(1., dtype=float32), Array(3., dtype=float32))
    >>> state
    {'total': Array(3., dtype=float32)}
    >>> state["total"] = jnp.zeros(())  # changed outside: the next call sees it
    >>> add(5.0)
    Array(5., dtype=float32)
    >>> add.policy
    ArgPolicies({0: 'alias', 'state': 'alias', ...: 'clone'})
    """
    chosen = partial_policy(policy, fun, len(bound))
    _check_policy(chosen)
    return JitPartial(jit(fun, policy=chosen, **jit_options), bound)


def partial_policy(
    policy: PolicySpec | None, fun: Callable[..., Any], num_bound: int
) -> Policy | ArgPolicies:
    """``jit_partial``'s ``policy=`` made canonical for ``num_bound`` bound arguments: None,
    the bound ones ``alias`` and the others ``clone``; a dict without ``...``, the same for the
    arguments it does not name; a policy, or a dict with ``...``, as :func:`treeclone.jit`
    reads it.

    >>> from treeclone._jit.partial import partial_policy
    >>> def step(model, optimizer, batch):
    ...     pass
    >>> partial_policy(None, step, 2)
    ArgPolicies({0: 'alias', 1: 'alias', 'model': 'alias', 'optimizer': 'alias', ...: 'clone'})
    >>> partial_policy({"batch": "strict"}, step, 1)
    ArgPolicies({0: 'alias', 2: 'strict', 'batch': 'strict', 'model': 'alias', ...: 'clone'})
    >>> partial_policy("alias", step, 2)
    Policy.alias
    """
    if policy is None:
        policy = {}
    if not isinstance(policy, Mapping) or Ellipsis in policy:
        return as_policy_spec(policy, fun)
    params = parameters(fun)
    if params is None:  # unknown signature: every bound position
        names: list[str | None] = [None] * num_bound
    else:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = [p.name for p in params if p.kind in kinds]
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            names += [None] * max(0, num_bound - len(names))
    spec: dict[Any, str | Policy] = dict(policy)
    for i, name in enumerate(names[:num_bound]):
        if i not in policy and name not in policy:
            spec[i] = "alias"
    return as_policy_spec(spec, fun, default="clone")


__all__ = ["JitPartial", "jit_partial", "partial_policy"]
