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
the cycle check, the box of the distinct leaves, the rule of ``traced=``) is ``_calls``'s.
"""

from __future__ import annotations

import functools
import inspect
import operator
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, overload

import jax
from jax.core import Tracer

from treeclone import _jax_compat, _lift, _native, _retrace, _trace, tree_util
from treeclone._bound import BoundArguments
from treeclone._calls import (
    Naming,
    StaticLeaves,
    argument_names,
    as_jit_outputs,
    check_cycles,
    jit_keystr,
    leaf_rule,
    normalize,
    reporting,
    take,
)

# Public here before the machinery jit shares moved to _calls: still importable from here.
from treeclone._calls import check_arguments as check_arguments
from treeclone._calls import is_array as is_array

# jax's description of a traced function, for its messages (None: jax's own naming).
from treeclone._jax_compat import INITIAL_RESULT_PATHS as _INITIAL_RESULT_PATHS
from treeclone._jax_compat import DebugInfo as _DebugInfo
from treeclone._jax_compat import fun_sourceinfo as _fun_sourceinfo
from treeclone._jax_compat import jaxpr_as_fun as _jaxpr_as_fun
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy_spec,
    check_discarded_mode,
    policy_override,
)

# Options that treeclone handles itself under a non-clone policy (the rest go to jax.jit).
_ARG_OPTIONS = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames")
_SHARDINGS = ("in_shardings", "out_shardings")
# Donation masks kept per jitted function (one per argument structure seen; cleared when full).
_MASK_CACHE_SIZE = 64
# Keys of argument structures kept per inner function for the lean path (cleared when full).
_KEY_CACHE_SIZE = 256
# When the lean path holds a call's leaves until the next call: their arrays on one of these
# platforms, at most this many bytes. A training loop lets go of its old state right after the
# call that reads it, while the computation may still run; on a TPU (jax 0.10, v5e) an array
# let go then costs the host time, so that a loop of small steps ran 15-19% slower than with
# each call's arguments kept a little longer (benches/release_probe.py). On this project's
# 2-core CPU the effect was mixed (jax.jit with its arguments held 8-13% slower on the nnx
# step, treeclone's strict 1-6% faster, alias either way), so the CPU is not among the
# platforms; the GPU, not measured, neither. Held, the leaves go at the next call (or at
# Jitted.clear_cache), when that computation is most likely done; the steps that gain are the
# short ones, over small states, and a wrapper called once keeps at most this much alive.
HOLD_INPUT_PLATFORMS = frozenset({"tpu"})
HOLD_INPUT_BYTES = 16 << 20


class _TraceInfo:
    """What one trace under a policy recorded; the static data of its ``_ResultBox``.

    ``plan``: the ``CallPlan``. ``paths``: for each output of the computation, where the user
    sees it (``['a']`` in the result, or an argument's key path for a value written back), the
    key JAX's messages about outputs print. ``out_tree`` and ``out_sources``: the function's
    own result rebuilt from the inputs (``("in", slot)``) and outputs (``("out", index)``), for
    ``lower``/``trace``/``eval_shape``; ``out_sources`` is None when it could not be worked out.
    ``next_inputs``: where the arguments' leaves are after a call (``_trace._next_inputs``),
    for ``jit_partial``. ``returned_inputs``: under a policy that gives ``jax.jit``'s results
    (strict), the input slots the result hands back as they came in, each to be returned as
    the ``jax.Array`` ``jax.jit`` would return for it (see :func:`as_jit_outputs`); empty
    under alias, whose result is plain Python's. ``writes``: under alias, for each output
    written back into an argument, ``(output index, argument, key path)``, the argument as a
    position among the dynamic ones or a keyword's name (see :func:`_check_enclosing_writes`).
    ``hold_inputs``: whether the lean path holds a call's leaves until the next call (their
    arrays are on a platform of ``HOLD_INPUT_PLATFORMS`` and total at most
    ``HOLD_INPUT_BYTES``). Compared by identity, as the plan is.
    """

    __slots__ = (
        "hold_inputs",
        "next_inputs",
        "out_sources",
        "out_tree",
        "paths",
        "plan",
        "returned_inputs",
        "static_outputs",
        "writes",
    )

    def __init__(
        self,
        plan: Any,
        paths: Sequence[str],
        out_tree: Any,
        out_sources: Any,
        next_inputs: tuple[tuple[int, ...], tuple[int, ...]] | bool | None = None,
    ):
        self.plan = plan
        self.paths = paths
        self.out_tree = out_tree
        self.out_sources = out_sources
        self.next_inputs = next_inputs
        self.returned_inputs: tuple[int, ...] = ()
        self.writes: tuple[tuple[int, int | str, str], ...] = ()
        self.static_outputs: tuple[tuple[int, Any], ...] = ()
        self.hold_inputs = False


# The inner jit's result: the outputs, with the trace's _TraceInfo as static data.
_ResultBox = _native.ResultBox


def _result_keys(box: _ResultBox) -> tuple[list, _TraceInfo]:
    # The key of each output is its path as the user sees it (a string: keystr prints it as is).
    return list(zip(box.info.paths, box.leaves, strict=True)), box.info


# jax rebuilds a _ResultBox at every call: attrgetter and the native type do it without a
# Python frame (rebuilding the result as anything but a _ResultBox would take jax.jit off its
# C++ fast path).
jax.tree_util.register_pytree_with_keys(
    _ResultBox, _result_keys, _ResultBox, operator.attrgetter("leaves", "info")
)
_native.invalidate_registry_cache()


def _as_tuple(x: int | str | Iterable | None) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


def _parameters(fun: Callable) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None


def _fun_name(fun: Callable) -> str:
    """The name jax.jit gives ``fun`` (its compiled module is ``jit_<name>``)."""
    while isinstance(fun, functools.partial) and getattr(fun, "__name__", None) is None:
        fun = fun.func
    return getattr(fun, "__name__", "<unnamed function>")


def _specified(sharding: Any) -> bool:
    """jax.jit's reading of ``in_shardings``/``out_shardings``: None means not given."""
    return sharding is not None and type(sharding).__name__ != "UnspecifiedValue"


def _resolve(fun: Callable, nums: Any, names: Any) -> tuple[frozenset[int], frozenset[str]]:
    """Argument positions and names, each completed from the other as jax.jit does."""
    nums, names = set(_as_tuple(nums)), set(_as_tuple(names))
    params = _parameters(fun)
    if params is not None:
        positional = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        nums = {n + len(positional) if n < 0 else n for n in nums}
        names |= {positional[n] for n in nums if 0 <= n < len(positional)}
        nums |= {i for i, name in enumerate(positional) if name in names}
    return frozenset(nums), frozenset(names)


def _hash_static(value: Any) -> None:
    try:
        hash(value)
    except TypeError as exc:
        raise ValueError(
            "Non-hashable static arguments are not supported. An error occurred while trying "
            f"to hash an object of type {type(value)}, {value!r}. The error was:\n"
            f"{type(exc).__name__}: {exc}\n"
        ) from None


def _hashable_options(kwargs: dict[str, Any]) -> tuple | None:
    """``kwargs`` as a hashable key, or None when some option is not hashable."""
    items = []
    for k, v in sorted(kwargs.items()):
        items.append((k, tuple(v) if isinstance(v, list) else v))
    key = tuple(items)
    try:
        hash(key)
    except TypeError:
        return None
    return key


# --- the registry of inner jits -----------------------------------------------------------------

# id(fun) -> (weak reference to fun, {options: {policy: (_Inner, its jax.jit)}}). The entry goes
# when fun does; the inner functions hold fun weakly, so the registry never keeps fun alive.
_SHARED: dict[int, tuple[weakref.ref, dict]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _SHARED.get(key)
    if entry is not None and entry[0] is ref:
        del _SHARED[key]


def _inner_cache(fun: Callable, options: tuple | None) -> tuple[dict, bool]:
    """Where the inner jax.jit of each policy lives for ``fun`` and these options, and whether
    it is shared by every ``treeclone.jit`` of ``fun`` (so ``jit(f)`` written twice shares one
    trace cache, as two ``jax.jit(f)`` do): when the options are hashable and ``fun`` can be
    weakly referenced."""
    if options is None:
        return {}, False
    entry = _SHARED.get(id(fun))
    if entry is None or entry[0]() is not fun:
        try:
            ref = weakref.ref(fun, functools.partial(_forget, id(fun)))
        except TypeError:
            return {}, False
        entry = _SHARED[id(fun)] = (ref, {})
    return entry[1].setdefault(options, {}), True


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
        self._static_nums, self._static_names = _resolve(
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
        self._donate_nums, self._donate_names = _resolve(
            fun, jit_kwargs.get("donate_argnums"), jit_kwargs.get("donate_argnames")
        )
        self._in_shardings_given = _specified(jit_kwargs.get("in_shardings"))
        self._traced = leaf_rule(traced)
        if self._traced is not None and self._in_shardings_given:
            raise ValueError(
                "treeclone.jit: in_shardings with traced= is not supported (a static leaf has "
                "no sharding); give the arrays their shardings with jax.device_put instead"
            )
        options = _hashable_options(self._kwargs)
        self._inner, self._shared = _inner_cache(
            fun, None if options is None else (options, self._traced)
        )
        self._masks: dict[tuple, _Donation] = {}
        # The lean path (_native.LeanCall), for arguments none donated, every leaf traced;
        # the others take _call_policy.
        self._lean_allowed = not (
            self._donate_nums
            or self._donate_names
            or self._traced is not None
            or self._in_shardings_given
        )
        self._set_up_calls()

    def _set_up_calls(self) -> None:
        """Hand the native base class (``_native.JitCore``, whose ``__call__`` every call runs:
        ``clone``'s check then ``jax.jit``'s call, or the lean path, or ``_call_policy``) what
        calls need."""
        self._init_core(
            self._policy,
            CLONE,
            policy_override.get,
            self._jax_jitted if self._traced is None else None,
            self._static_nums,
            self._static_names,
            self._lean_allowed,
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

    def _call_policy(
        self,
        policy: Policy | ArgPolicies,
        args: tuple,
        kwargs: dict,
        bound: BoundArguments | None = None,
    ) -> Any:
        call = self._prepare(policy, args, kwargs, bound)
        # While the inner jit runs, its debug info can name the arguments.
        saved = _native.swap_running_call(call)
        try:
            result = call.jitted(call.key, call.donated, *call.kept)
        finally:
            _native.swap_running_call(saved)
        info = result.info
        outputs = result.leaves
        if info.static_outputs:  # what the function made that is static under ``traced``
            outputs = list(outputs)
            for i, value in info.static_outputs:
                outputs[i] = value
        out = _end_of_call(self._fun, lambda: call, info, call.leaves, call.objects, outputs)
        if bound is not None:
            bound.advance(result.info.next_inputs, call.leaves, outputs)
        return out

    def _lean_call(self) -> _native.LeanCall:
        """The lean path's native call (``_native.LeanCall``) of ``self._policy``'s inner jit;
        ``JitCore`` makes it with this at the first call that takes the lean path."""
        inner, jitted = self._inner_entry(self._policy)
        statics = None
        if self._static_nums or self._static_names:
            statics = (self._static_nums, self._static_names, _hash_static)
        return _native.LeanCall(
            inner,
            jitted,
            inner.keys,
            inner.key_of,
            Tracer,
            _finish_lean,
            statics,
        )

    def _inner_entry(self, policy: Policy | ArgPolicies) -> tuple[_Inner, Any]:
        """The inner function under ``policy`` and its ``jax.jit`` (made at the first call)."""
        entry = self._inner.get(policy)
        if entry is None:
            entry = self._inner[policy] = _make_inner(
                self._fun, policy, self._kwargs, self._naming, self._shared, self._traced
            )
        return entry

    def _prepare(
        self,
        policy: Policy | ArgPolicies,
        args: tuple,
        kwargs: dict,
        bound: BoundArguments | None = None,
    ) -> _Call:
        """Everything about one call up to running the inner jit. With ``bound``, the first
        arguments are ``jit_partial``'s, flattened already: only the others are flattened."""
        entry = self._inner_entry(policy)
        if kwargs and self._in_shardings_given:
            raise ValueError("pjit does not support kwargs when in_shardings is specified.")
        given = args, kwargs
        statics = None
        positions: Sequence[int] = range(len(args))
        if self._static_nums or self._static_names:
            args, kwargs, statics, positions = self._split_statics(args, kwargs)
        if len(kwargs) > 1:  # keyword order is not part of a call's structure, as in jax.jit
            kwargs = dict(sorted(kwargs.items()))
        try:
            if bound is None:
                leaves, sdef, objects = _native.flatten_shared((*args, kwargs))
            else:
                leaves, sdef, objects = bound.join(args, kwargs)
        except ValueError:
            self._check_cycles(*given)  # the text of every policy, naming the argument
            raise
        if statics is not None:  # hashed after the flatten, as jax.jit orders its errors
            for *_, v in statics[1] + statics[2]:
                _hash_static(v)
        donation = None
        if self._donate_nums or self._donate_names:
            n = len(positions) if statics is None else statics[0]
            donation = self._mask(sdef, n, positions, kwargs)
        static = None
        if self._traced is not None:
            static = StaticLeaves.of(leaves, self._traced, args, kwargs, self._naming)
        key = _Key((sdef, statics, donation, static))
        kept, donated = _jit_order(leaves, donation, static)
        inner, jitted = entry
        return _Call(inner, jitted, key, kept, donated, leaves, objects, args, kwargs, positions)

    def _split_statics(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple, list[int]]:
        """Take the static arguments out. Each static value is keyed with its type, as jax.jit
        keys them (``2`` and ``2.0`` are equal but trace differently); ``_prepare`` hashes them
        after the flatten of the others."""
        n = len(args)
        static_nums = normalize(self._static_nums, n)
        static_pos = tuple((i, type(args[i]), args[i]) for i in sorted(static_nums) if i < n)
        static_kw = tuple(
            sorted((k, type(v), v) for k, v in kwargs.items() if k in self._static_names)
        )
        positions = [i for i in range(n) if i not in static_nums]
        dyn_args = tuple(args[i] for i in positions)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        return dyn_args, dyn_kwargs, (n, static_pos, static_kw), positions

    def _mask(self, sdef: Any, n: int, positions: Sequence[int], kwargs: dict) -> _Donation:
        """The donation of a call: worked out once per structure and number of arguments
        (which fix the dynamic positions and the keyword names), then looked up."""
        key = (sdef, n)
        donation = self._masks.get(key)
        if donation is None:
            if len(self._masks) >= _MASK_CACHE_SIZE:
                self._masks.clear()
            keep = self._keep_mask(sdef, positions, n, tuple(kwargs))
            donation = self._masks[key] = _Donation(keep)
        return donation

    def _keep_mask(
        self, sdef: Any, positions: Sequence[int], n: int, names: Sequence[str]
    ) -> tuple[bool, ...]:
        """Per distinct leaf: False when every occurrence is in a donated argument.

        ``positions[j]`` is the position, among the call's ``n``, of the j-th dynamic argument;
        ``names`` are the keyword arguments, in the order of the flattened kwargs dict.
        """
        donate_nums = normalize(self._donate_nums, n)
        root = sdef.num_nodes - 1
        kept: set[int] = set()
        donated: set[int] = set()
        per_child = sdef.child_slots(root)
        for j, position in enumerate(positions):
            (donated if position in donate_nums else kept).update(per_child[j])
        kwargs_node = sdef.children_of(root)[len(positions)]
        for name, slots in zip(names, sdef.child_slots(kwargs_node), strict=True):
            (donated if name in self._donate_names else kept).update(slots)
        return tuple(s in kept or s not in donated for s in range(sdef.num_leaves))

    # --- the rest of jax.jit's interface --------------------------------------------------------

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).lower(...)``: the computation of ``fun`` itself (nothing written
        back); a call with the same arguments afterwards does not trace again.

        >>> import jax.numpy as jnp, treeclone
        >>> def push(stack, x):
        ...     stack.append(x)
        ...     return x * 2
        >>> lowered = treeclone.jit(push, policy="alias").lower([], jnp.ones(2))
        >>> lowered.compile()([], jnp.ones(2))
        Array([2., 2.], dtype=float32)
        """
        return self._ahead_of_time("lower", args, kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).trace(...)`` (see :meth:`lower`).

        >>> import jax.numpy as jnp, treeclone
        >>> traced = treeclone.jit(jnp.negative, policy="alias").trace(jnp.ones(2))
        >>> traced.jaxpr
        { lambda ; a:f32[2]. let b:f32[2] = neg a in (b,) }
        """
        return self._ahead_of_time("trace", args, kwargs)

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
        return self._ahead_of_time("eval_shape", args, kwargs)

    def _ahead_of_time(self, method: str, args: tuple, kwargs: dict) -> Any:
        """Under clone, jax.jit's. Under another policy, the function is traced once, as the
        call would trace it (so the call that follows finds that trace in the cache), and the
        stage returned is that of a stand-in for ``fun`` (its name, signature and options)
        which evaluates that trace and rebuilds ``fun``'s own result: the same computation as
        ``jax.jit(fun)``'s, without running ``fun`` a second time."""
        if self._traced is not None:
            # jax.jit's stages take only arrays; a stand-in that keeps static leaves out of
            # them is not built yet.
            raise NotImplementedError(
                f"treeclone.jit(..., traced=...).{method} is not supported: call the function "
                "(it traces and compiles as jax.jit does), or use eqx.filter_jit's stages"
            )
        policy = policy_override.get() or self._policy
        if policy is not CLONE and _jaxpr_as_fun:  # (a JAX without it: jax.jit's stages)
            call = self._prepare(policy, args, kwargs)
            slots = call.slots_of_jax_leaves()
            if slots is not None:
                saved = _native.swap_running_call(call)
                try:
                    traced = call.jitted.trace(call.key, call.donated, *call.kept)
                finally:
                    _native.swap_running_call(saved)
                info = _jax_compat.traced_out_tree(traced).node_data()[1]
                if isinstance(info, _TraceInfo) and info.out_sources is not None:
                    stand_in = self._stand_in(call, traced, info, slots)
                    return getattr(stand_in, method)(*args, **kwargs)
        return getattr(self._jax_jitted, method)(*args, **kwargs)

    def _stand_in(self, call: _Call, traced: Any, info: _TraceInfo, slots: list[int]) -> Any:
        """A jax.jit, with ``fun``'s options, of a function that looks like ``fun`` and
        computes what the inner function's trace ``traced`` computes."""
        evaluate = _jaxpr_as_fun(traced.jaxpr)
        donation, num_slots = call.donation, len(call.leaves)

        def stand_in(*args: Any, **kwargs: Any) -> Any:
            if self._static_nums or self._static_names:
                args, kwargs, *_ = self._split_statics(args, kwargs)
            flat = jax.tree_util.tree_leaves((args, dict(sorted(kwargs.items()))))
            values: list[Any] = [None] * num_slots
            for x, s in zip(flat, slots, strict=True):
                if values[s] is None:
                    values[s] = x
            if donation is None:
                outputs = evaluate(*values)
            else:  # the inner function's inputs: the donated leaves, then the kept ones
                outputs = evaluate(*donation.donated(values), *donation.kept(values))
            result = [outputs[i] if kind == "out" else values[i] for kind, i in info.out_sources]
            return jax.tree_util.tree_unflatten(info.out_tree, result)

        functools.update_wrapper(stand_in, self._fun)  # signature, name and source of fun
        stand_in.__name__ = _fun_name(self._fun)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # jax.jit warned already
            return jax.jit(stand_in, **self._kwargs)

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


def _is_static(static: StaticLeaves | None, slot: int) -> bool:
    return static is not None and slot in static.slots


def _jit_order(
    leaves: list, donation: _Donation | None, static: StaticLeaves | None
) -> tuple[list, list | None]:
    """A call's distinct leaves (or anything per leaf, their names) as the inner jit takes
    them: the kept ones and the donated ones (None: no donation), without the static ones."""
    if static is None:
        if donation is None:
            return leaves, None
        return donation.kept(leaves), donation.donated(leaves)
    keep = None if donation is None else donation.keep
    kept = [x for s, x in enumerate(leaves) if s not in static.slots and (keep is None or keep[s])]
    if keep is None:
        return kept, None
    return kept, [x for s, x in enumerate(leaves) if s not in static.slots and not keep[s]]


def _from_jit_order(
    kept: Sequence, donated: Sequence | None, keep: Sequence[bool] | None, static: Any
) -> list:
    """The inverse of :func:`_jit_order`: every distinct leaf in its slot, the static ones
    (``static``: a ``StaticLeaves`` or None) put back as they are."""
    if keep is None and static is None:
        return list(kept)
    values = {} if static is None else {s: x for s, _, x in static.entries}
    n = len(kept) + len(donated or ()) + len(values)
    it_kept, it_donated = iter(kept), iter(donated or ())
    return [
        values[s] if s in values else next(it_kept if keep is None or keep[s] else it_donated)
        for s in range(n)
    ]


class _Key(tuple):
    """The inner jit's static argument: ``(structure, static arguments, donation, static
    leaves)``. A tuple, hashed and compared in C, but of a subclass, so that it is a pytree
    leaf: JAX before 0.7 flattens static arguments, and a key flattened as a tuple would walk
    the static values (a cyclic one without end, exhausting the recursion counter)."""

    __slots__ = ()


class _Donation:
    """Which distinct leaves of a call are donated (``keep[s]`` False), and how to split the
    leaves into the kept ones and the donated ones (computed once per structure). Part of the
    inner jit's cache key: equal when the masks are, hashed once."""

    __slots__ = ("donated", "hash", "keep", "kept")

    def __init__(self, keep: tuple[bool, ...]):
        self.keep = keep
        self.hash = hash(keep)
        self.kept = take([s for s, k in enumerate(keep) if k])
        self.donated = take([s for s, k in enumerate(keep) if not k])

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, _Donation) and other.keep == self.keep)

    def __hash__(self) -> int:
        return self.hash

    def __repr__(self) -> str:  # read in JAX's explanation of a cache miss
        return f"donated leaves {[s for s, k in enumerate(self.keep) if not k]}"


class _Call:
    """One call under a policy: what goes to the inner jit (``jitted(key, donated, *kept)``,
    see :class:`_Inner`), and what naming it needs."""

    __slots__ = (
        "args",
        "donated",
        "inner",
        "jitted",
        "kept",
        "key",
        "kwargs",
        "leaves",
        "objects",
        "positions",
    )

    def __init__(
        self,
        inner: _Inner,
        jitted: Any,
        key: tuple,
        kept: list,
        donated: list | None,
        leaves: list,
        objects: list,
        args: tuple,
        kwargs: dict,
        positions: Sequence[int],
    ):
        self.inner, self.jitted, self.key = inner, jitted, key
        self.kept, self.donated = kept, donated
        self.leaves, self.objects = leaves, objects
        self.args, self.kwargs, self.positions = args, kwargs, positions

    @property
    def donation(self) -> _Donation | None:
        return self.key[2]

    def named_arguments(self, naming: Naming) -> list[tuple[str, Any]]:
        """The call's dynamic arguments with the names jax.jit gives them, in its order."""
        statics = self.key[1]
        n = len(self.positions) if statics is None else statics[0]
        values = [*self.args, *self.kwargs.values()]
        static = () if statics is None else [k for k, *_ in statics[2]]
        names = naming.arguments(n, self.positions, self.kwargs, static)
        return list(zip(names, values, strict=True))

    def slot_names(self, naming: Naming) -> list[str]:
        """For each distinct leaf, its key path as jax.jit names it (the first place it is in)."""
        found: dict[int, list[str]] = {}
        for name, value in self.named_arguments(naming):
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                found.setdefault(id(leaf), []).append(name + jit_keystr(path))
        # A Python scalar is a value: the same object may be several leaves; name them in turn.
        seen: dict[int, int] = {}
        names = []
        for leaf in self.leaves:
            places = found.get(id(leaf), [""])
            k = seen[id(leaf)] = seen.get(id(leaf), -1) + 1
            names.append(places[min(k, len(places) - 1)])
        return names

    def slots_of_jax_leaves(self) -> list[int] | None:
        """The distinct leaf of each leaf of the arguments as jax flattens them, or None when
        they do not correspond (a node whose flatten makes new leaves each time)."""
        where: dict[int, list[int]] = {}
        for s, leaf in enumerate(self.leaves):
            where.setdefault(id(leaf), []).append(s)
        seen: dict[int, int] = {}
        slots = []
        for leaf in jax.tree_util.tree_leaves((self.args, self.kwargs)):
            candidates = where.get(id(leaf))
            if candidates is None:
                return None
            k = seen[id(leaf)] = seen.get(id(leaf), -1) + 1
            slots.append(candidates[min(k, len(candidates) - 1)])
        return slots if len(set(slots)) == len(self.leaves) else None


def _lean_call_record(call: tuple) -> _Call:
    """The ``_Call`` of a call on the lean path from what ``_native.LeanCall`` records of it:
    ``(inner, jitted, key, leaves, objects, args, kwargs, positions)``, the dynamic arguments
    and their positions among all the positional ones (None: all). Every leaf is kept (none
    donated, none static)."""
    inner, jitted, key, leaves, objects, args, kwargs, positions = call
    if positions is None:
        positions = range(len(args))
    return _Call(inner, jitted, key, leaves, None, leaves, objects, args, kwargs, positions)


def _end_of_call(
    fun: Callable,
    the_call: Callable[[], _Call],
    info: _TraceInfo,
    leaves: list,
    objects: list,
    outputs: list,
) -> Any:
    """The result of a call and its write-back: rule 25a's check first for a write-back inside
    a JAX transformation (a Tracer output), then the plan, with the inputs strict hands back
    as ``jax.jit``'s arrays."""
    if info.writes and isinstance(outputs[0], Tracer):
        _check_enclosing_writes(fun, the_call(), info.writes, outputs)
    return info.plan.apply(as_jit_outputs(leaves, info.returned_inputs), objects, outputs)


def _finish_lean(call: tuple, info: _TraceInfo, outputs: list) -> Any:
    """The end of a call on the lean path whose result needs Python (``_native.LeanCall``)."""
    inner, _, _, leaves, objects, *_ = call
    record = functools.partial(_lean_call_record, call)
    return _end_of_call(inner._fun(), record, info, leaves, objects, outputs)


# --- the inner function -------------------------------------------------------------------------


class _Inner:
    """The function the inner ``jax.jit`` traces under a policy: it rebuilds the arguments from
    the call's distinct leaves, runs ``fun`` on them (``_trace.run``) and returns the outputs
    boxed with what the trace recorded.

    It is called as ``jitted(key, donated, *kept)``: ``key``, static, is the call's
    ``(structure, static arguments, donation, static leaves)``; ``donated`` the donated leaves
    (a list, donated as a whole, or None); ``kept`` the others, each its own argument, the
    shape JAX's C++ dispatch handles fastest (a box of them, a pytree node of its own, cost a
    microsecond or two more a call).

    To jax it looks like ``fun``: its name, its ``repr``, and (``__fun_debug_info__``) the
    source of ``fun`` and the names of the call's arguments, so that jax's messages (a
    non-array argument, a traced value used as a Python bool, an output that is not a JAX
    type) name the user's function, argument and key path as they do under ``jax.jit``.
    """

    def __init__(
        self,
        fun: Callable,
        policy: Policy | ArgPolicies,
        kwargs: dict,
        naming: Naming,
        weak: bool,
        traced: Callable[[Any], bool] | None = None,
    ) -> None:
        # Held weakly when shared between wrappers (the registry must not keep fun alive);
        # every caller holds fun itself.
        self._fun: Callable[[], Any] = weakref.ref(fun) if weak else (lambda: fun)
        self._policy = policy
        self._traced = traced
        self._naming = naming
        self.__name__ = _fun_name(fun)
        self.__qualname__ = getattr(fun, "__qualname__", self.__name__)
        self._sourceinfo: Any = _fun_sourceinfo(fun) if _DebugInfo is not None else None
        in_shardings = kwargs.get("in_shardings")
        self._in_shardings = in_shardings if _specified(in_shardings) else None
        out_shardings = kwargs.get("out_shardings")
        self._constrain_out = (
            _constrain_outputs(out_shardings) if _specified(out_shardings) else None
        )
        self.retraces = _retrace.History(fun, policy, naming.name)
        # The lean path's key of each argument structure, one object per structure: JAX
        # compares a cached key with the call's by identity first.
        self.keys: dict[Any, tuple] = {}

    def key_of(self, sdef: Any, statics: tuple | None = None) -> tuple:
        """The key of a call of structure ``sdef`` and static arguments ``statics`` (as
        ``Jitted._split_statics`` gives them) on the lean path (``_native.LeanCall``), kept
        under ``sdef`` or ``(sdef, statics)``."""
        if len(self.keys) >= _KEY_CACHE_SIZE:
            self.keys.clear()
        key = _Key((sdef, statics, None, None))
        self.keys[sdef if statics is None else (sdef, statics)] = key
        return key

    def call(self) -> _Call | None:
        """The call of this function running now in this thread (None when traced ahead of
        time, or when the call running is another function's)."""
        call = _native.running_call()
        if type(call) is tuple:  # the lean path's, made into a _Call when a trace needs it
            if call[0] is not self:
                return None
            call = _lean_call_record(call)
            _native.swap_running_call(call)
        return call if call is not None and call.inner is self else None

    def __repr__(self) -> str:
        return repr(self._fun())

    @property
    def __fun_debug_info__(self) -> Any:
        """jax's description of the function for the call now running (None: jax's own)."""
        call = self.call()
        if call is None or _DebugInfo is None:
            return None
        try:
            kept, donated = _jit_order(call.slot_names(self._naming), *call.key[2:])
            names = (donated or []) + kept  # the inner jit's order: (key, donated, *kept)
            return _DebugInfo("jit", self._sourceinfo, tuple(names), _INITIAL_RESULT_PATHS)
        except Exception:  # noqa: BLE001 - naming is best effort; never fail a call over it
            return None

    def __call__(self, key: tuple, donated: list | None, *kept: Any) -> _ResultBox:
        sdef, statics, donation, static = key
        keep = None if donation is None else donation.keep
        leaves = _from_jit_order(kept, donated, keep, static)
        if self._in_shardings is not None:
            num_args = len(sdef.children_of(sdef.num_nodes - 1)) - 1
            leaves = _constrain_inputs(sdef, leaves, num_args, self._in_shardings)
        static_args = None
        if statics is not None:
            total, static_pos, static_kw = statics
            static_args = (total, {i: v for i, _, v in static_pos}, {k: v for k, _, v in static_kw})
        call = self.call()  # None when traced ahead of time
        prepared = _lift.begin(
            self._fun(),
            self._policy,
            self._naming,
            sdef,
            leaves,
            static_args,
            caller_objects=None if call is None else call.objects,
        )
        policy, positions = prepared.req.policy, prepared.req.layout.positions
        called = prepared.call()
        if self._constrain_out is not None:
            called.out = self._constrain_out(called.out)
        keep_inputs = self._keep_inputs(leaves, keep, static, called.out)
        traced = called.diff()
        traced_plan = traced.plan(keep_inputs=keep_inputs)
        plan, outputs = traced_plan.plan, traced_plan.outputs
        # Why this trace happened, in the user's words (trace time only: _retrace).
        self.retraces.traced(key, leaves, prepared.req.layout, (prepared.args, prepared.kwargs))
        info = self._describe(plan, outputs, traced)
        info.next_inputs = traced.next_inputs(traced_plan)
        info.hold_inputs = (
            call is not None
            and _platform(call.leaves) in HOLD_INPUT_PLATFORMS
            and _traced_bytes(leaves) <= HOLD_INPUT_BYTES
        )
        if policy.mutations == "propagate" and outputs:
            names_now = [self._naming.name(i) for i in positions]
            info.writes = _written(
                outputs, prepared.args, prepared.kwargs, names_now, prepared.req.arg_policies
            )
        if policy.mutations != "propagate":
            # strict gives jax.jit's results: an input it hands back is returned as a jax.Array
            # (rule 12a); alias gives plain Python's, the caller's own object.
            # treeclone's own flatten: JAX's recurses natively and fails on a deep result
            # (the trace has flattened this one already).
            returned = {id(x) for x in _native.leaves(called.out)}
            info.returned_inputs = tuple(
                s
                for s, x in enumerate(leaves)
                if id(x) in returned
                and (keep_inputs is None or keep_inputs[s])
                and not _is_static(static, s)  # handed back as it is, as equinox does
            )
        if self._traced is not None:
            # What the function made that the rule leaves static (a new string, a function,
            # a Python number) is not an output of the computation: it comes back as it is,
            # as from equinox's filter_jit; a traced value always is one.
            info.static_outputs = tuple(
                (i, x)
                for i, x in enumerate(outputs)
                if not isinstance(x, Tracer) and not self._traced(x)
            )
            if info.static_outputs:
                outputs = list(outputs)
                for i, _ in info.static_outputs:
                    outputs[i] = None
        return _ResultBox(info, outputs)

    def _keep_inputs(
        self, leaves: list, keep: Sequence[bool] | None, static: Any, out: Any
    ) -> list[bool] | None:
        """Per input leaf, whether it may be handed back to the caller as it came in (None:
        every one may). Not when it was donated (jax deletes it) or resharded by
        in_shardings and the function returns it: then the computation outputs it. A donated
        leaf the function does not return is not an output, so that XLA can reuse its buffer
        (and warns, as under jax.jit, when none of the outputs can use it); the caller's
        containers keep the donated array, which jax deletes, as under jax.jit."""
        if self._in_shardings is not None:
            consumed = list(range(len(leaves)))
        elif keep is not None:  # donated (a static leaf is not an input of the computation)
            consumed = [s for s, k in enumerate(keep) if not k and not _is_static(static, s)]
        else:
            return None
        if not consumed:
            return None
        try:
            returned = {id(x) for x in jax.tree_util.tree_leaves(out)}
        except Exception:  # noqa: BLE001 - the trace's own flatten reports it
            returned = set()
        keep_inputs = [True] * len(leaves)
        for s in consumed:
            keep_inputs[s] = id(leaves[s]) not in returned
        return keep_inputs

    def _describe(self, plan: Any, outputs: list, traced: _trace.Traced) -> _TraceInfo:
        """The trace's ``_TraceInfo``: where each output is, and how ``fun``'s result is made."""
        paths = [""] * len(outputs)
        out_tree, out_sources = None, None
        prepared = traced.prepared
        leaves = prepared.req.leaves
        try:
            where: dict[int, str] = {}
            out_leaves, out_tree = jax.tree_util.tree_flatten_with_path(traced.out)
            for path, leaf in out_leaves:
                where.setdefault(id(leaf), jit_keystr(path))
            args, kwargs = prepared.args, prepared.kwargs
            positions = prepared.req.layout.positions
            arg_names = [self._naming.name(i) for i in positions] + [str(k) for k in kwargs]
            for name, value in zip(arg_names, [*args, *kwargs.values()], strict=True):
                for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                    where.setdefault(id(leaf), name + jit_keystr(path))
            paths = [where.get(id(x), "") for x in outputs]
            index = {id(x): ("in", s) for s, x in enumerate(leaves)}
            index.update({id(x): ("out", i) for i, x in reversed(list(enumerate(outputs)))})
            out_sources = tuple(index[id(leaf)] for _, leaf in out_leaves)
        except Exception:  # noqa: BLE001 - descriptions only; the plan is what matters
            out_sources = None
        return _TraceInfo(plan, tuple(paths), out_tree, out_sources)


def _platform(values: Sequence[Any]) -> str:
    """The platform of the first ``jax.Array`` among ``values`` (``"cpu"``, ``"tpu"``, ...);
    without one, JAX's default backend, where the others go."""
    for x in values:
        if isinstance(x, jax.Array) and not isinstance(x, Tracer):
            try:
                device: Any = next(iter(x.sharding.device_set))
                return str(device.platform)
            except Exception:  # noqa: BLE001 - a deleted array, an odd sharding: the default
                break
    return jax.default_backend()


def _traced_bytes(leaves: list) -> int:
    """The bytes of the arrays a trace's input ``leaves`` stand for (its tracers' shapes and
    dtypes; a dtype without an item size, such as a PRNG key's, counts as 8 bytes an item)."""
    total = 0
    for x in leaves:
        if isinstance(x, Tracer):
            aval = x.aval
            itemsize = getattr(getattr(aval, "dtype", None), "itemsize", 8)
            total += getattr(aval, "size", 1) * itemsize
    return total


def _written(
    outputs: list,
    args: tuple,
    kwargs: dict,
    names: Sequence[str],
    per_argument: Sequence[Policy] | None = None,
) -> tuple[tuple[int, int | str, str], ...]:
    """``(output index, argument, key path)`` for each output of a trace that the function left
    in its (rebuilt) arguments ``args``/``kwargs``: what the write-back puts into the caller's
    objects. ``argument`` is a position in ``args`` or a name in ``kwargs``. With a policy
    per argument (``per_argument``, in the same order), only the arguments written back."""
    index: dict[int, int] = {}
    for o, x in enumerate(outputs):
        index.setdefault(id(x), o)
    found = []
    arguments = [
        *((j, names[j], a) for j, a in enumerate(args)),
        *((k, k, v) for k, v in kwargs.items()),
    ]
    if per_argument is not None:
        arguments = [
            a for a, p in zip(arguments, per_argument, strict=True) if p.mutations == "propagate"
        ]
    for where, name, value in arguments:
        # treeclone's flatten: JAX's recurses natively and fails on a deep argument.
        for path, leaf in tree_util.tree_flatten_with_path(value)[0]:
            output = index.get(id(leaf))
            if output is not None:
                found.append((output, where, name + jit_keystr(path)))
    return tuple(found)


def _check_enclosing_writes(
    fun: Callable, call: _Call, writes: Sequence[tuple[int, int | str, str]], outputs: list
) -> None:
    """Inside an enclosing JAX transformation (its values are tracers), rule 25a's ValueError,
    before anything is written, when a traced output would be written into an argument whose
    leaves are all concrete: an object from outside the transformation (closed over, or passed
    through as ``jax.grad`` passes the arguments it does not differentiate), which would keep
    the tracer once the transformation returns, or a copy the transformation made and drops
    (``jax.vmap``'s unbatched arguments): either way the caller would not get the value. An
    argument without leaves (``metrics = {}`` made inside) cannot be told apart and is
    written."""
    outside: dict[int | str, bool] = {}
    for o, where, path in writes:
        if not isinstance(outputs[o], Tracer):
            continue
        if where not in outside:
            value = call.args[where] if isinstance(where, int) else call.kwargs[where]
            held = _native.leaves(value)
            outside[where] = (
                bool(held)
                and not _trace.made_for_a_call(value)  # a treeclone transformation's own
                and not any(isinstance(x, Tracer) for x in held)
            )
        if outside[where]:
            raise ValueError(
                f"{_fun_name(fun)} (policy alias) was called inside a JAX transformation "
                "(jax.grad, jax.vmap, jax.jit, jax.lax.scan, ...) and would write a traced "
                f"value of it into {path}, whose argument holds none of that transformation's "
                "values: an object from outside it would keep a tracer once it returns, and a "
                "copy it made of its argument is dropped, so the caller would not get the "
                "value either way. Nothing was written. Use treeclone's transformation there "
                "(treeclone.grad, treeclone.vmap, treeclone.jit, treeclone.scan, "
                "treeclone.checkpoint, with policy='alias') and pass that object to it as an "
                "argument (a loop's carry): it writes concrete values back into the caller's "
                "objects. Or return the value."
            )


def _make_inner(
    fun: Callable,
    policy: Policy | ArgPolicies,
    kwargs: dict[str, Any],
    naming: Naming,
    weak: bool,
    traced: Callable[[Any], bool] | None = None,
) -> tuple[_Inner, Any]:
    """The ``jax.jit`` that runs ``fun`` under ``policy`` on a call's distinct leaves, as
    ``jitted(key, donated, *kept)`` (see :class:`_Inner`); ``traced``: the rule that leaves
    the other leaves static (``jit(traced=...)``)."""
    inner = _Inner(fun, policy, kwargs, naming, weak, traced)
    options = {k: v for k, v in kwargs.items() if k not in _ARG_OPTIONS + _SHARDINGS}
    options["static_argnums"] = (0,)
    if kwargs.get("donate_argnums") is not None or kwargs.get("donate_argnames") is not None:
        options["donate_argnums"] = (1,)
    with warnings.catch_warnings():
        # jax.jit already warned about deprecated options when the user's function was wrapped.
        warnings.simplefilter("ignore", DeprecationWarning)
        return inner, jax.jit(inner, **options)


def _shardings_by_leaf(prefix: Any, tree: Any) -> dict[int, Any]:
    """``id(leaf) -> sharding`` for the leaves of ``tree`` under the sharding prefix."""
    found: dict[int, Any] = {}

    def visit(sharding: Any, subtree: Any) -> None:
        for leaf in jax.tree_util.tree_leaves(subtree):
            found[id(leaf)] = sharding

    jax.tree_util.tree_map(visit, prefix, tree, is_leaf=lambda x: x is None)
    return found


def _constrain_inputs(sdef: Any, leaves: list, num_args: int, in_shardings: Any) -> list:
    """Apply ``in_shardings`` (a prefix of the positional arguments) to the input leaves."""
    args = sdef.unflatten(leaves)[:num_args]
    if not isinstance(in_shardings, (tuple, list)):
        in_shardings = (in_shardings,) * num_args
    by_leaf = _shardings_by_leaf(tuple(in_shardings), tuple(args))
    return [
        x if by_leaf.get(id(x)) is None else jax.lax.with_sharding_constraint(x, by_leaf[id(x)])
        for x in leaves
    ]


def _constrain_outputs(out_shardings: Any) -> Callable[[Any], Any]:
    """A function applying ``out_shardings`` (a prefix of the result) to a result."""

    def constrain(out: Any) -> Any:
        by_leaf = _shardings_by_leaf(out_shardings, out)
        return jax.tree_util.tree_map(
            lambda x: (
                x
                if by_leaf.get(id(x)) is None
                else jax.lax.with_sharding_constraint(x, by_leaf[id(x)])
            ),
            out,
        )

    return constrain


class _Unspecified:
    """The default of ``in_shardings`` and ``out_shardings``: not given (printed as jax.jit's
    own default is)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UnspecifiedValue"


_UNSPECIFIED: Any = _Unspecified()

# jax.jit's keywords (those of every JAX treeclone supports) with their defaults. A keyword is
# passed to jax.jit only when given a value other than its default, which is jax.jit's own
# default: so a keyword that this JAX does not have (abstracted_axes since JAX 0.8) is an error
# only when it is used, the TypeError jax.jit itself raises.
_JIT_DEFAULTS: dict[str, Any] = {
    "in_shardings": _UNSPECIFIED,
    "out_shardings": _UNSPECIFIED,
    "static_argnums": None,
    "static_argnames": None,
    "donate_argnums": None,
    "donate_argnames": None,
    "keep_unused": False,
    "device": None,
    "backend": None,
    "inline": False,
    "abstracted_axes": None,
    "compiler_options": None,
}


def _jax_jit_keywords() -> frozenset[str] | None:
    """The keywords this JAX's ``jax.jit`` takes (None: its signature is unknown)."""
    try:
        parameters = inspect.signature(jax.jit).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):  # pragma: no cover
        return None
    return frozenset(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


_JAX_JIT_KEYWORDS = _jax_jit_keywords()


def _given(options: dict[str, Any]) -> dict[str, Any]:
    """The options given a value other than their default, checked against this JAX's jax.jit
    at once (also in the decorator form), with the TypeError jax.jit raises."""
    given = {k: v for k, v in options.items() if v is not _JIT_DEFAULTS[k]}
    for k in given:
        if _JAX_JIT_KEYWORDS is not None and k not in _JAX_JIT_KEYWORDS:
            raise TypeError(f"jit() got an unexpected keyword argument '{k}'")
    return given


@overload
def jit(
    fun: Callable[..., Any],
    /,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    in_shardings: Any = ...,
    out_shardings: Any = ...,
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
) -> Jitted: ...
@overload
def jit(
    fun: None = None,
    /,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    in_shardings: Any = ...,
    out_shardings: Any = ...,
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
) -> Callable[[Callable[..., Any]], Jitted]: ...
def jit(
    fun: Callable[..., Any] | None = None,
    /,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    in_shardings: Any = _UNSPECIFIED,
    out_shardings: Any = _UNSPECIFIED,
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
) -> Jitted | Callable[[Callable[..., Any]], Jitted]:
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
    given = _given(
        {
            "in_shardings": in_shardings,
            "out_shardings": out_shardings,
            "static_argnums": static_argnums,
            "static_argnames": static_argnames,
            "donate_argnums": donate_argnums,
            "donate_argnames": donate_argnames,
            "keep_unused": keep_unused,
            "device": device,
            "backend": backend,
            "inline": inline,
            "abstracted_axes": abstracted_axes,
            "compiler_options": compiler_options,
        }
    )
    if fun is None:
        return lambda f: Jitted(f, policy, given, discarded_mutations, traced)
    return Jitted(fun, policy, given, discarded_mutations, traced)


__all__: Sequence[str] = ["Jitted", "argument_names", "jit", "reporting"]
