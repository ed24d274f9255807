"""What every lifted transformation's wrapper shares."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, cast

from treeclone._lift.naming import Naming
from treeclone._lift.runner import current_policy
from treeclone.policies import ArgPolicies, Policy, PolicySpec, as_policy_spec


class Wrapper:
    """What every lifted transformation's wrapper shares: the prologue of its ``__init__``
    (``Wrapper.__init__``), it binds as a method, as the function it wraps does, its repr
    names the transformation (``name``), the function and the policy, and it keeps one runner
    per policy (:meth:`_runner`, made by the subclass's ``make_runner``), so that the JAX
    transformation it hands the runner to finds its cached trace again at the next call."""

    name = "transformation"
    # Whether the JAX transformation is made (and JAX checks its options) before the policy is
    # checked: each wrapper keeps the order of errors it has always had (jax.vmap's and
    # jax.grad's checks come first, the policy of checkpoint and shard_map does).
    jax_checks_first = False
    _fun: Callable[..., Any]
    _naming: Naming
    _policy: Policy | ArgPolicies
    _jax: Callable[..., Any]
    # A dict, not a Kept: it is read at every call (the hot path), where a hit is one lookup
    # without a lock or a hash check, and it holds a few policies (the wrapper's own, those of
    # the blocks it is called in), so it needs no bound.
    _runners: dict[Policy | ArgPolicies, Any]
    _lock: threading.Lock

    def __init__(self, fun: Callable[..., Any], policy: PolicySpec | ArgPolicies):
        """The prologue every wrapper shares, called once the subclass has kept what
        :meth:`make_jax` needs: ``fun``'s name, doc and ``__wrapped__``, its naming, the
        policy (``as_policy_spec``: a dict is checked against ``fun``'s parameters), the JAX
        transformation of ``fun`` itself that a call under ``clone`` runs, in the order
        ``jax_checks_first`` says, and the per-policy runners."""
        # name, doc, __wrapped__ (a subclass is callable)
        functools.update_wrapper(cast(Callable[..., Any], self), fun, updated=())
        self._fun, self._naming = fun, Naming(fun)
        if self.jax_checks_first:
            self._jax = self.make_jax()
            self._policy = as_policy_spec(policy, fun)
        else:
            self._policy = as_policy_spec(policy, fun)
            self._jax = self.make_jax()
        self._runners, self._lock = {}, threading.Lock()

    def make_jax(self) -> Callable[..., Any]:
        """The JAX transformation of ``fun`` itself (reporting the mutations it discards), what
        a call under ``clone`` runs; JAX checks its options as it is made."""
        raise NotImplementedError

    def make_runner(self, policy: Policy | ArgPolicies) -> Any:
        raise NotImplementedError

    def _runner(self, policy: Policy | ArgPolicies) -> Any:
        """The runner of ``policy`` (with what the transformation wraps it in), made once."""
        entry = self._runners.get(policy)
        if entry is None:
            with self._lock:
                entry = self._runners.get(policy)
                if entry is None:
                    entry = self._runners[policy] = self.make_runner(policy)
        return entry

    def _policy_now(self) -> Policy | ArgPolicies:
        """The policy of the call being made: a ``with treeclone.policy(...)`` block's, else
        this wrapper's."""
        return current_policy(self._policy)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(cast(Callable[..., Any], self), obj)  # subclasses are callable

    def __repr__(self) -> str:
        return f"<treeclone.{self.name} of {self._fun!r} (policy {self._policy!r})>"
