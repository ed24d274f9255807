"""``treeclone.jit``: a drop-in for ``jax.jit`` with the call's policy chosen explicitly.

Under ``clone`` (the default) a call is exactly a ``jax.jit`` call: the same object does the
work. Under any other policy the arguments are flattened by treeclone's identity-tracking
flatten; the distinct leaves go to one ``jax.jit`` of an inner function, boxed in a pytree node
whose static data is the arguments' structure with its sharing (so JAX's own cache keys on
it); the inner function rebuilds the arguments, runs the user's function and records, once per
trace, a native ``CallPlan`` that rebuilds the results (and writes mutations back) at every
call. The plan travels as the static data of the output box, so each of JAX's cache entries
carries its own.

The user's function object is never written to: the inner ``jax.jit``s are kept in a registry
keyed by a weak reference to it, so that ``jit(f)`` written twice shares one trace cache, as two
``jax.jit(f)`` do.

What jit shares with ``jit_partial`` and the lifted transformations (the naming of arguments,
the cycle check, the box of the distinct leaves, the rule of ``traced=``) is the lift's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, overload

import jax
from jax.core import Tracer

from treeclone import _effects, _lift, _native
from treeclone._jit.bound import BoundArguments, JitInterface
from treeclone._jit.call import CallShape
from treeclone._jit.inner import Inner, finish_lean, make_inner
from treeclone._jit.options import (
    UNSPECIFIED,
    given_options,
    hashable_options,
    inner_cache,
    resolve_arguments,
)
from treeclone._jit.placement import ShardedArguments, specified
from treeclone._jit.stages import StageSource, trace
from treeclone._lift import (
    Naming,
    check_cycles,
    is_array,
    leaf_rule,
    reporting,
)
from treeclone._native import FlattenFailed
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy_spec,
    check_discarded_mode,
    policy_override,
)

# --- the registry of inner jits -----------------------------------------------------------------


# --- the jitted function ------------------------------------------------------------------------


class _FunSignature:
    """``jitted.__signature__``: the signature of the jitted function, as on jax.jit's wrapper
    (``inspect.signature(fun)``, raising what it raises). Read on the class it is None, so that
    ``inspect.signature(Jitted)`` still describes the class."""

    @overload
    def __get__(self, obj: None, objtype: Any = None) -> None: ...
    @overload
    def __get__(self, obj: Jitted, objtype: Any = None) -> inspect.Signature: ...
    def __get__(self, obj: Jitted | None, objtype: Any = None) -> inspect.Signature | None:
        if obj is None:
            return None
        signature = obj._naming.signature
        return inspect.signature(obj._fun) if signature is None else signature


class Jitted(_native.JitCore):
    """What ``treeclone.jit(fun, ...)`` returns: call it like the ``jax.jit`` of ``fun``.

    It has what user code reaches for on ``jax.jit``'s wrapper: ``fun``'s name, docstring,
    ``__wrapped__`` and ``__signature__``, :meth:`lower`, :meth:`trace`, :meth:`eval_shape`,
    :meth:`clear_cache` and :meth:`_cache_size`; and :attr:`policy` and :meth:`with_policy`.

    >>> import inspect, jax.numpy as jnp, treeclone
    >>> def scale(x, factor=2.0):
    ...     "Multiply x by factor."
    ...     return x * factor
    >>> jitted = treeclone.jit(scale, policy="alias")
    >>> jitted.__name__, jitted.__doc__, inspect.signature(jitted)
    ('scale', 'Multiply x by factor.', <Signature (x, factor=2.0)>)
    >>> jitted(jnp.ones(2))
    Array([2., 2.], dtype=float32)
    >>> jitted._cache_size()
    1
    """

    __signature__ = _FunSignature()

    def __init__(
        self,
        fun: Callable,
        policy: PolicySpec | ArgPolicies,
        jit_kwargs: dict[str, Any],
        discarded_mutations: str | None = None,
        traced: str | Callable[[Any], bool] | None = None,
        keep_shardings: bool = True,
    ):
        """Use :func:`jit`; ``jit_kwargs`` are passed to ``jax.jit`` as they are."""
        if not callable(fun):
            raise TypeError(f"Expected a callable value, got {fun!r}")
        # Name, docstring, __wrapped__ and a copy of fun's __dict__ go into self (as jax.jit's
        # wrapper does), first, so that nothing copied from fun replaces what is set below.
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._policy = as_policy_spec(policy, fun)
        self._kwargs = dict(jit_kwargs)
        self._static_nums, self._static_names = resolve_arguments(
            fun, jit_kwargs.get("static_argnums"), jit_kwargs.get("static_argnames")
        )
        self._naming = Naming(fun)
        if discarded_mutations is not None:
            check_discarded_mode(discarded_mutations)
        # The clone policy: jax.jit of fun, which reports at each trace what fun changed in
        # place and does not return (discarded: a MutationWarning); cached calls are jax.jit's.
        self._jax_jitted: Any = jax.jit(
            reporting(fun, self._static_nums, self._static_names, discarded_mutations),
            **jit_kwargs,
        )
        self._donate_nums, self._donate_names = resolve_arguments(
            fun, jit_kwargs.get("donate_argnums"), jit_kwargs.get("donate_argnames")
        )
        self._in_shardings_given = specified(jit_kwargs.get("in_shardings"))
        self._traced = leaf_rule(traced)
        self._keep_shardings = bool(keep_shardings)
        options = hashable_options(self._kwargs)
        self._inner, self._shared = inner_cache(
            fun, None if options is None else (options, self._traced, self._keep_shardings)
        )
        self._shape = CallShape(
            self._naming,
            (self._static_nums, self._static_names),
            (self._donate_nums, self._donate_names),
            self._in_shardings_given,
            self._traced,
        )
        self._set_up_calls()

    def _set_up_calls(self) -> None:
        """Hand the native base class (``_native.JitCore``, whose ``__call__`` every call runs:
        ``clone``'s check then ``jax.jit``'s call, or the native call of the policy, and
        ``_refuse`` for an argument that cannot be flattened) what calls need."""
        self._init_core(
            self._policy,
            CLONE,
            policy_override.get,
            self._jax_jitted if self._traced is None else None,
            self._static_nums,
            self._static_names,
        )

    # --- policies -----------------------------------------------------------------------------

    @property
    def policy(self) -> Policy | ArgPolicies:
        """The policy calls use (unless a ``with treeclone.policy(...)`` block overrides it),
        or the policy of each argument (:class:`treeclone.policies.ArgPolicies`).

        >>> import treeclone
        >>> treeclone.jit(abs, policy="strict").policy
        Policy.strict
        """
        return self._policy

    def with_policy(self, policy: PolicySpec | ArgPolicies) -> Jitted:
        """The same jitted function under another policy (sharing compiled code).

        >>> import treeclone
        >>> jitted = treeclone.jit(abs)
        >>> jitted.with_policy("alias").policy, jitted.policy
        (Policy.alias, Policy.clone)
        """
        other = Jitted.__new__(Jitted)
        other.__dict__.update(self.__dict__)
        other._policy = as_policy_spec(policy, self._fun)
        other._set_up_calls()
        return other

    def _check_cycles(self, args: tuple, kwargs: dict) -> None:
        check_cycles(self._naming, args, kwargs, self._static_nums, self._static_names)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    # --- the policy path ----------------------------------------------------------------------

    def _refuse(self, failed: FlattenFailed, args: tuple, kwargs: dict) -> NoReturn:
        """The error of a call whose arguments the native call could not flatten (called by
        the native bases): it names the argument (``CallShape.refuse``)."""
        self._shape.refuse(failed, args, kwargs)

    def _explain_type_error(self, exc: TypeError, args: tuple, kwargs: dict) -> TypeError:
        """``exc`` with treeclone's remedy when it is jax.jit's refusal of a leaf that is not a
        JAX type (an equinox Module's activation function): ``traced="arrays"``; else
        ``exc`` itself. Called on the error path only (also by the native calls)."""
        if self._traced is not None:
            return exc
        found = self._shape.not_a_jax_type(args, kwargs)
        if found is None:
            return exc
        return _effects.traced_remedy(exc, *found)

    def _keep_arguments(self, refs: tuple) -> BoundArguments:
        """The flatten of the leading arguments that ``refs`` refer to (weakly), which the
        native call keeps between calls while they are the same objects
        (``rust/call/kept.rs``); made once they are met twice in a row."""
        return BoundArguments(refs, self._naming, weak=True)

    def _lean_call(self, policy: Policy | ArgPolicies) -> _native.LeanCall:
        """The native call (``_native.LeanCall``) of ``policy``'s inner jit; ``JitCore`` makes
        it with this at the first call under ``policy``."""
        inner, jitted = self._inner_entry(policy)
        return _native.LeanCall(
            inner,
            jitted,
            inner.keys,
            functools.partial(self._shape.lean_key, inner),
            Tracer,
            finish_lean,
            jax.Array,  # where the arguments are: as _jit.placement.placements says
            self._shape.statics,  # the static arguments split as the Python path splits them
            self._traced,
            self._traced is is_array,  # equinox's rule decides by a leaf's type
            inner.placement.keyed,
        )

    def _inner_entry(self, policy: Policy | ArgPolicies) -> tuple[Inner, Any]:
        """The inner function under ``policy`` and its ``jax.jit`` (made at the first call)."""
        entry = self._inner.get(policy)
        if entry is None:
            entry = self._inner[policy] = make_inner(
                self._fun,
                policy,
                self._kwargs,
                self._naming,
                self._shared,
                self._traced,
                self._keep_shardings,
            )
        return entry

    # --- the rest of jax.jit's interface --------------------------------------------------------

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).lower(...)``. Under a policy other than ``clone`` (or with
        ``traced=``), the computation that runs (with what is written back); compiled, its
        call does what the jitted call does (docs/semantics.md, "ahead of time").

        >>> import jax.numpy as jnp, treeclone
        >>> def push(stack, x):
        ...     stack.append(x)
        ...     return x * 2
        >>> stack = []
        >>> compiled = treeclone.jit(push, policy="alias").lower(stack, jnp.ones(2)).compile()
        >>> compiled(stack, jnp.ones(2))
        Array([2., 2.], dtype=float32)
        >>> stack
        [Array([1., 1.], dtype=float32)]
        """
        return self._stage("lower", args, kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).trace(...)`` (see :meth:`lower`).

        >>> import jax.numpy as jnp, treeclone
        >>> traced = treeclone.jit(jnp.negative, policy="alias").trace(jnp.ones(2))
        >>> traced.out_info
        ShapeDtypeStruct(shape=(2,), dtype=float32)
        """
        return self._stage("trace", args, kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).eval_shape(...)``: shapes of the outputs; nothing is written back.

        >>> import jax.numpy as jnp, treeclone
        >>> def push(stack, x):
        ...     stack.append(x)
        ...     return {"doubled": x * 2}
        >>> stack = []
        >>> treeclone.jit(push, policy="alias").eval_shape(stack, jnp.ones(3))
        {'doubled': ShapeDtypeStruct(shape=(3,), dtype=float32)}
        >>> stack
        []
        """
        return self._stage("eval_shape", args, kwargs)

    def _stage(
        self,
        method: str,
        args: tuple,
        kwargs: dict,
        bound: BoundArguments | None = None,
        partial: Any = None,
    ) -> Any:
        """Under clone, jax.jit's stage. Under another policy (or with ``traced=``), the inner
        function traced for this call as the call would trace it (so a call with the same
        arguments afterwards finds the trace cached), in treeclone's stages (``stages``);
        ``bound`` and ``partial``: ``jit_partial``'s (:class:`StageSource`)."""
        policy = policy_override.get() or self._policy
        if policy is CLONE and self._traced is None and bound is None:
            return getattr(self._jax_jitted, method)(*args, **kwargs)
        entry = self._inner_entry(policy)
        lean = self._lean_for(policy)
        source = StageSource(
            self._fun, self._shape, entry, lean, policy, self._policy, bound, partial
        )
        try:
            traced = trace(source, args, kwargs)
        except ShardedArguments:  # keyed by the arguments' shardings, as the call is
            traced = trace(source, args, kwargs)
        if method == "lower":
            return traced.lower()
        if method == "eval_shape":
            out = traced.out_info
            if out is None and bound is None:  # leaves that could not be told apart
                return self._jax_jitted.eval_shape(*args, **kwargs)
            return out
        return traced

    def clear_cache(self) -> None:
        """Empty the compiled-code caches of every policy (``jax.jit(fun).clear_cache()``).

        >>> import jax.numpy as jnp, treeclone
        >>> jitted = treeclone.jit(lambda x: x + 1)
        >>> _ = jitted(1.0)
        >>> jitted.clear_cache()
        >>> jitted._cache_size()
        0
        """
        self._jax_jitted.clear_cache()
        for _, jitted in self._inner.values():
            jitted.clear_cache()
        self._release_held()

    def _cache_size(self) -> int:
        """The number of compiled entries this function's calls can reuse, as
        ``jax.jit(fun)._cache_size()`` counts them: under ``clone`` alone it is exactly that
        number (the calls are ``jax.jit``'s); each other policy used adds the entries of its own
        inner ``jax.jit`` (one per argument structure, sharing and static values it was called
        with, so ``f(a, a)`` and ``f(a, b)`` are two entries there and one under ``jax.jit``).
        Like ``jax.jit``'s caches, these are shared by every ``treeclone.jit`` of the same
        function with the same options, and by :meth:`with_policy`.

        >>> import jax.numpy as jnp, treeclone
        >>> jitted = treeclone.jit(lambda x: x * 2)
        >>> _ = jitted(jnp.ones(2)), jitted(jnp.ones(2)), jitted(jnp.ones(3))
        >>> jitted._cache_size()
        2
        """
        return self._jax_jitted._cache_size() + sum(
            jitted._cache_size() for _, jitted in self._inner.values()
        )

    def __repr__(self) -> str:
        return f"<treeclone.jit of {self._fun!r} (policy {self._policy!r})>"

    def interface(self) -> JitInterface:
        """What :func:`treeclone.jit_partial` uses of this function: a
        :class:`~treeclone._jit.bound.JitInterface` (the package's own interface between the
        two modules, so that neither reads the other's private attributes).

        >>> import treeclone
        >>> def scale(x, n):
        ...     return x * n
        >>> jitted = treeclone.jit(scale, policy="alias", static_argnums=1)
        >>> interface = jitted.interface()
        >>> interface.fun is scale, interface.policy, interface.static_names
        (True, Policy.alias, frozenset({'n'}))
        """
        return JitInterface(
            fun=self._fun,
            naming=self._naming,
            static_nums=self._static_nums,
            static_names=self._static_names,
            policy=self._policy,
            cache_size=self._cache_size,
            stage=self._stage,
        )


# --- the inner function -------------------------------------------------------------------------


@_lift.fun_or_decorator
def jit(
    fun: Callable[..., Any] | None = None,
    /,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    in_shardings: Any = UNSPECIFIED,
    out_shardings: Any = UNSPECIFIED,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Iterable[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Iterable[str] | None = None,
    keep_unused: bool = False,
    device: Any | None = None,
    backend: str | None = None,
    inline: bool = False,
    abstracted_axes: Any | None = None,
    compiler_options: dict[str, Any] | None = None,
    discarded_mutations: str | None = None,
    traced: str | Callable[[Any], bool] | None = None,
    keep_shardings: bool = True,
) -> Jitted | _lift.Decorator[Jitted]:
    """``jax.jit(fun, ...)`` with an explicit policy (``"clone"``, ``"alias"``, ``"strict"``
    or a :class:`treeclone.Policy`): see :mod:`treeclone.policies`.

    The keywords are ``jax.jit``'s, with its meanings and defaults. One is passed on only when
    given, so each works exactly when this JAX's ``jax.jit`` has it (``abstracted_axes``: JAX
    before 0.8); another keyword, or ``fun`` given by keyword, is the TypeError ``jax.jit``
    raises. Without ``fun``, the decorator that applies these options. Under ``clone`` a call
    is ``jax.jit(fun, ...)``'s own, and a trace that finds ``fun`` changing an input in place
    without returning it (a change ``clone`` discards) warns (``treeclone.MutationWarning``);
    ``discarded_mutations="error"`` or ``"off"`` chooses otherwise for this function
    (:func:`treeclone.set_discarded_mutations` for all).

    ``traced`` decides, leaf by leaf, what is traced: None (``jax.jit``'s rule: every leaf,
    and a leaf that is not a JAX type is its TypeError), ``"arrays"`` (equinox's rule, also
    named ``"equinox"``: JAX and NumPy arrays are traced, every other leaf, a function, a
    string, a Python number, is static, as under ``eqx.filter_jit``), or a predicate on a
    leaf. A static leaf is part of the cache key (a new value, a new trace) and is handed to
    the function as it is; what the function returns that the rule leaves static comes back
    as it is.

    Under ``alias`` and ``strict`` an array the function leaves in an argument in place of
    one placed on several devices (or by ``in_shardings``) keeps that array's sharding, as an
    in-place update leaves a state where it is; ``keep_shardings=False`` lets XLA choose, as
    ``jax.jit`` does for an output without ``out_shardings`` (docs/semantics.md, "Shardings").

    >>> import jax.numpy as jnp, treeclone
    >>> def append_double(xs, x):
    ...     xs.append(x * 2)
    ...     return len(xs)
    >>> xs = []
    >>> treeclone.jit(append_double)(xs, jnp.ones(2))  # clone: what jax.jit does
    Array(1, dtype=int32, weak_type=True)
    >>> xs
    []
    >>> treeclone.jit(append_double, policy="alias")(xs, jnp.ones(2))  # as without jit
    Array(1, dtype=int32, weak_type=True)
    >>> xs
    [Array([2., 2.], dtype=float32)]
    >>> @treeclone.jit(policy="strict", static_argnames="n")
    ... def power(x, n):
    ...     return x**n
    >>> power(jnp.arange(3.0), n=2)
    Array([0., 1., 4.], dtype=float32)
    >>> treeclone.jit(fun=power)
    Traceback (most recent call last):
    ...
    TypeError: jit() got some positional-only arguments passed as keyword arguments: 'fun'
    >>> def apply(model, x):
    ...     return model["activation"](x * model["scale"]), model["name"]
    >>> model = {"activation": jnp.tanh, "scale": 2.0, "name": "mlp"}
    >>> treeclone.jit(apply, traced="arrays")(model, jnp.zeros(2))
    (Array([0., 0.], dtype=float32), 'mlp')
    """
    # Here the locals are the parameters: jax.jit's keywords are picked out by name.
    given = given_options(locals())
    if fun is None:
        return _lift.Decorator(Jitted, policy, given, discarded_mutations, traced, keep_shardings)
    return Jitted(fun, policy, given, discarded_mutations, traced, keep_shardings)


__all__: Sequence[str] = ["Jitted", "jit"]
