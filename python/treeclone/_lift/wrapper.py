"""What every lifted transformation's wrapper shares."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, cast

from treeclone._lift.runner import current_policy
from treeclone.policies import ArgPolicies, Policy


class Wrapper:
    """What every lifted transformation's wrapper shares: it binds as a method, as the function
    it wraps does, its repr names the transformation (``name``), the function and the policy,
    and it keeps one runner per policy (:meth:`_runner`, made by the subclass's
    ``make_runner``), so that the JAX transformation it hands the runner to finds its cached
    trace again at the next call."""

    name = "transformation"
    _fun: Callable[..., Any]
    _policy: Policy | ArgPolicies
    # A dict, not a Kept: it is read at every call (the hot path), where a hit is one lookup
    # without a lock or a hash check, and it holds a few policies (the wrapper's own, those of
    # the blocks it is called in), so it needs no bound.
    _runners: dict[Policy | ArgPolicies, Any]
    _lock: threading.Lock

    def _keep_runners(self) -> None:
        """Start the per-policy runners (in the subclass's ``__init__``)."""
        self._runners, self._lock = {}, threading.Lock()

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
