"""What every lifted transformation's wrapper shares, and the two forms of every
transformation's function: with ``fun``, and without it the decorator that takes it."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

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


P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Decorator(Generic[T]):
    """A transformation called without its function (``@treeclone.vmap(in_axes=1)``): the
    decorator that makes ``make(fun, *args, **kwargs)`` of the function it is given.

    >>> from treeclone._lift import Decorator
    >>> scaled = Decorator(lambda fun, k: lambda x: k * fun(x), 3)
    >>> scaled(abs)(-2)
    6
    """

    __slots__ = ("args", "kwargs", "make")

    def __init__(self, make: Callable[..., T], *args: Any, **kwargs: Any):
        self.make, self.args, self.kwargs = make, args, kwargs

    def __call__(self, fun: Callable[..., Any], /) -> T:
        return self.make(fun, *self.args, **self.kwargs)


class FunOrDecorator(Protocol[P, T_co]):
    """What type checkers see of a transformation made with :func:`fun_or_decorator`: its
    parameters after ``fun`` (``P``), and what it makes of ``fun`` (``T_co``), or without it,
    the decorator that makes that."""

    @overload
    def __call__(self, fun: Callable[..., Any], *args: P.args, **kwargs: P.kwargs) -> T_co: ...
    @overload
    def __call__(
        self, fun: None = None, *args: P.args, **kwargs: P.kwargs
    ) -> Callable[[Callable[..., Any]], T_co]: ...


def fun_or_decorator(
    transformation: Callable[Concatenate[Any, P], T | Decorator[T]],
) -> FunOrDecorator[P, T]:
    """``transformation`` itself, typed as its two forms: called with ``fun`` it gives a ``T``;
    with ``fun`` None (or left out) the :class:`Decorator` that makes one. One signature
    serves both forms, where ``@typing.overload`` would repeat it twice over.

    >>> from treeclone._lift import Decorator, fun_or_decorator
    >>> @fun_or_decorator
    ... def twice(fun=None, *, times: int = 2):
    ...     if fun is None:
    ...         return Decorator(twice, times=times)
    ...     return lambda x: [fun(x)] * times
    >>> twice(abs)(-1), twice(times=3)(abs)(-1)
    ([1, 1], [1, 1, 1])
    """
    return cast(FunOrDecorator[P, T], transformation)
