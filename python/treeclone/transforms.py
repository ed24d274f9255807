"""``treeclone.grad``, ``value_and_grad`` and ``checkpoint`` (``remat``) with a policy.

Each takes the JAX function's arguments plus ``policy=``: ``"clone"`` (the default: the call
is the JAX transformation's own, the same object does the work), ``"alias"`` (in-place
mutations of the inputs reach the caller's objects as in plain Python, as concrete arrays),
``"strict"`` (an input mutated and not returned is a :class:`~treeclone.MutationError` naming
the argument and key path) or a :class:`~treeclone.Policy`. A ``with treeclone.policy(...)``
block overrides the policy of every call made inside it, as for ``treeclone.jit``.

Under a policy other than ``clone`` the call is flattened with identity (the same array passed
twice is one input; a shared container is one object inside), the function runs on the
arguments rebuilt from the JAX transformation's tracers, and what it did comes back as a plan
that rebuilds the result and writes mutations back (``treeclone._lift``). The transforms nest
with each other and with ``treeclone.jit`` in any order. ``docs/semantics.md`` states the
rules and names their tests.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

import jax
import numpy as np

from treeclone import _lift
from treeclone._jax_compat import DebugInfo
from treeclone.jit import _ArgsBox, _Naming, reporting
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    _override,
    as_policy,
    as_policy_spec,
)

__all__ = ["checkpoint", "grad", "remat", "value_and_grad"]


def _policy_of(default: Policy | ArgPolicies) -> Policy | ArgPolicies:
    return _override.get() or default  # a block's policy wins over a dict, as for jit


# --- grad and value_and_grad ---------------------------------------------------------------------


def _check_argnums(argnums: Any) -> tuple[int, ...]:
    """``argnums`` as a tuple, checked as ``jax.grad`` checks it (the same TypeError)."""
    if isinstance(argnums, (int, np.integer)) and not isinstance(argnums, bool):
        return (int(argnums),)
    if isinstance(argnums, Sequence) and all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in argnums
    ):
        return tuple(int(i) for i in argnums)
    raise TypeError(
        f"argnums must be an int or a sequence of ints, got {argnums!r} ({type(argnums).__name__})"
    )


def _dtype_problem(x: Any, holomorphic: bool, allow_int: bool) -> str | None:
    """What ``jax.grad`` would say about differentiating with respect to ``x`` (None: fine)."""
    try:
        dtype = jax.api_util.shaped_abstractify(x).dtype
    except TypeError:
        return f"a value of type {type(x).__name__}, which is not a valid JAX type"
    issub = jax.dtypes.issubdtype
    if holomorphic and not issub(dtype, np.complexfloating):
        return f"grad with holomorphic=True requires inputs with complex dtype, but got {dtype}"
    if issub(dtype, jax.dtypes.extended) or issub(dtype, np.integer) or issub(dtype, np.bool_):
        if not allow_int:
            return (
                "grad requires real- or complex-valued inputs (input dtype that is a sub-dtype "
                f"of np.inexact), but got {dtype}. If you want to use Boolean- or integer-valued "
                "inputs, use vjp or set allow_int to True"
            )
    elif not issub(dtype, np.inexact):
        return (
            "grad requires numerical-valued inputs (input dtype that is a sub-dtype of np.bool_ "
            f"or np.number), but got {dtype}"
        )
    return None


class _GradRunner(_lift.Runner):
    """The function ``jax.value_and_grad(..., argnums=0, has_aux=True)`` differentiates: of the
    distinct leaves of the differentiated arguments, with the other leaves and the call's key
    in an ``_ArgsBox``. It returns the value to differentiate and, as JAX's aux output (so it
    comes back concrete), the lifted function's :class:`~treeclone._lift.Out`, whose record's
    ``extra`` says where the gradients go: per differentiated argument, JAX's structure of it
    and, per leaf of that structure, the differentiated input it is."""

    traced_for = "vjp"

    def __init__(
        self, fun: Callable[..., Any], policy: Policy | ArgPolicies, naming: _Naming, has_aux: bool
    ):
        super().__init__(fun, policy, naming)
        self.has_aux = has_aux

    def __call__(self, diff: list, box: _ArgsBox) -> tuple[Any, _lift.Out]:
        sdef, mask, argnums = box.key
        it_diff, it_other = iter(diff), iter(box.leaves)
        leaves = [next(it_diff) if d else next(it_other) for d in mask]
        index = {id(x): j for j, x in enumerate(diff)}
        seen: dict[str, Any] = {}

        def on_args(args: tuple, kwargs: dict) -> None:
            structure = []
            for i in argnums:
                flat, treedef = jax.tree_util.tree_flatten(args[i])
                try:
                    structure.append((treedef, [index[id(x)] for x in flat]))
                except KeyError:
                    raise TypeError(
                        f"{self.naming.name(i)}: the pytree's unflatten does not keep the "
                        "leaves it is given (it converts or copies them), so its gradient "
                        "cannot be matched to its leaves under this policy; use policy='clone'"
                    ) from None
            seen["structure"] = tuple(structure)

        def check_out(out: Any) -> Any:
            if self.has_aux:
                if not (isinstance(out, (tuple, list)) and len(out) == 2):
                    raise TypeError(
                        "expected function with aux output to return a two-element tuple, but "
                        f"got type {type(out)} with value {out!r}"
                    )
                seen["value"] = out[0]
            else:
                seen["value"] = out
            return out

        plan, outputs = self.trace(sdef, leaves, None, on_args, check_out)
        return seen["value"], _lift.Out(_lift.Record(plan, seen["structure"]), outputs)


class _Grad(_lift.Wrapper):
    """What :func:`grad` and :func:`value_and_grad` return (see there)."""

    def __init__(
        self,
        fun: Callable[..., Any],
        argnums: int | Sequence[int],
        has_aux: bool,
        holomorphic: bool,
        allow_int: bool,
        reduce_axes: Sequence[Any],
        policy: PolicySpec | ArgPolicies,
        with_value: bool,
    ):
        functools.update_wrapper(self, fun, updated=())  # name, doc, __wrapped__; first
        options: dict[str, Any] = {"argnums": argnums, "has_aux": has_aux}
        options.update(holomorphic=holomorphic, allow_int=allow_int)
        if reduce_axes:  # jax's own error (or meaning, on a JAX that still has it)
            options["reduce_axes"] = reduce_axes
        transform = jax.value_and_grad if with_value else jax.grad
        # First: a bad option is jax's own error.
        self._jax = transform(reporting(fun), **options)
        self._policy = as_policy_spec(policy, fun)
        self._argnums = _check_argnums(argnums)
        self._single = not isinstance(argnums, Sequence)
        self._has_aux, self._with_value = has_aux, with_value
        self._holomorphic, self._allow_int = holomorphic, allow_int
        self._fun = fun
        self._naming = _Naming(fun)
        self._lifted: dict[Policy | ArgPolicies, tuple[_GradRunner, Callable[..., Any]]] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:  # type: ignore[override]
        return "value_and_grad" if self._with_value else "grad"

    def _runner(self, policy: Policy | ArgPolicies) -> tuple[_GradRunner, Callable[..., Any]]:
        entry = self._lifted.get(policy)
        if entry is None:
            with self._lock:
                runner = _GradRunner(self._fun, policy, self._naming, self._has_aux)
                vg = jax.value_and_grad(
                    runner,
                    argnums=0,
                    has_aux=True,
                    holomorphic=self._holomorphic,
                    allow_int=self._allow_int,
                )
                entry = self._lifted.setdefault(policy, (runner, vg))
        return entry

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = _policy_of(self._policy)
        if policy is CLONE:
            _lift.check_call(self._naming, args, kwargs)  # a cycle: rule 14's ValueError
            return self._jax(*args, **kwargs)
        n = len(args)
        if max(self._argnums, default=-1) >= n or min(self._argnums, default=0) < -n:
            raise TypeError(
                f"differentiating with respect to argnums={self._given_argnums()} requires at "
                f"least {max(max(self._argnums) + 1, -min(self._argnums))} positional arguments "
                f"to be passed by the caller, but got only {n} positional arguments."
            )
        argnums = tuple(i + n if i < 0 else i for i in self._argnums)
        call = _lift.flatten_call(self._naming, args, kwargs)
        per_arg = call.arg_slots()
        diff_slots = sorted({s for i in argnums for s in per_arg[i]})
        for s in diff_slots:
            problem = _dtype_problem(call.leaves[s], self._holomorphic, self._allow_int)
            if problem is not None:
                raise TypeError(f"{call.slot_path(self._naming, s)}: {problem}.")
        chosen = set(diff_slots)
        mask = tuple(s in chosen for s in range(len(call.leaves)))
        diff = [call.leaves[s] for s in diff_slots]
        others = [x for s, x in enumerate(call.leaves) if s not in chosen]
        box = _ArgsBox(others, (call.sdef, mask, argnums))
        runner, vg = self._runner(policy)
        slot_names = call.slot_names(self._naming) if DebugInfo is not None else None
        names = None if slot_names is None else [slot_names[s] for s in diff_slots]
        with runner.calling(call.objects, names):
            (_, out), grads_flat = vg(diff, box)
        result = out.record.plan.apply(call.leaves, call.objects, out.leaves)
        grads = tuple(
            treedef.unflatten([grads_flat[j] for j in where]) for treedef, where in out.record.extra
        )
        grad_value = grads[0] if self._single else grads
        if self._with_value:
            return result, grad_value
        if self._has_aux:
            return grad_value, result[1]
        return grad_value

    def _given_argnums(self) -> Any:
        return self._argnums[0] if self._single else self._argnums


@overload
def grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Callable[..., Any]: ...
@overload
def grad(
    fun: None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def grad(
    fun: Callable[..., Any] | None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Callable[..., Any] | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``jax.grad(fun, argnums, has_aux, holomorphic, allow_int)`` with a policy.

    The arguments are ``jax.grad``'s, with its meanings; without ``fun``, the decorator that
    applies them. Under ``clone`` a call is ``jax.grad``'s own. Under ``alias`` and ``strict``:

    * the gradient has JAX's structure of each differentiated argument (fresh containers, as
      ``jax.grad`` gives; a tuple of them when ``argnums`` is a sequence). Identity is
      preserved: an array reachable from two places of the arguments is one input, and each
      place gets the total gradient of that input (that of the function written with the one
      array used at both places);
    * in-place mutations of the inputs (running statistics, counters) reach the caller's
      objects under ``alias``, as concrete arrays, and the returned aux is rebuilt as under
      ``treeclone.jit`` (a returned input is the caller's same object); under ``strict`` an
      input mutated and not returned (in the aux) is a :class:`~treeclone.MutationError`.

    >>> import jax.numpy as jnp, treeclone
    >>> def loss(params, stats):
    ...     stats["calls"] = stats["calls"] + 1  # an in-place update while differentiated
    ...     return jnp.sum(params["w"] ** 2)
    >>> params, stats = {"w": jnp.array([1.0, 2.0])}, {"calls": jnp.zeros(())}
    >>> treeclone.grad(loss)(params, stats)  # clone: jax.grad's own call
    {'w': Array([2., 4.], dtype=float32)}
    >>> stats = {"calls": jnp.zeros(())}
    >>> treeclone.grad(loss, policy="alias")(params, stats)
    {'w': Array([2., 4.], dtype=float32)}
    >>> stats
    {'calls': Array(1., dtype=float32)}
    >>> treeclone.grad(loss, policy="strict")(params, stats)
    Traceback (most recent call last):
    ...
    treeclone.policies.MutationError: loss mutated its inputs in place without returning them ...
      stats['calls']: replaced
    ...
    """
    if fun is None:
        return lambda f: grad(
            f, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy=policy
        )
    return _Grad(fun, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy, False)


@overload
def value_and_grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Callable[..., tuple[Any, Any]]: ...
@overload
def value_and_grad(
    fun: None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Callable[[Callable[..., Any]], Callable[..., tuple[Any, Any]]]: ...
def value_and_grad(
    fun: Callable[..., Any] | None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Callable[..., tuple[Any, Any]] | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``jax.value_and_grad(fun, ...)`` with a policy: a call returns ``(value, grads)``, or
    ``((value, aux), grads)`` with ``has_aux``, where ``value`` and ``aux`` are the function's
    result rebuilt as under ``treeclone.jit`` (under ``alias`` a returned input is the
    caller's same object) and ``grads`` are as for :func:`grad`.

    >>> import jax.numpy as jnp, treeclone
    >>> def loss(w, counter):
    ...     counter.append(len(counter))  # the caller's list grows under alias
    ...     return jnp.sum(w * w), counter
    >>> counter = []
    >>> (value, aux), g = treeclone.value_and_grad(loss, has_aux=True, policy="alias")(
    ...     jnp.array([3.0]), counter
    ... )
    >>> value, g, aux is counter, counter
    (Array(9., dtype=float32), Array([6.], dtype=float32), True, [0])
    """
    if fun is None:
        return lambda f: value_and_grad(
            f, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy=policy
        )
    return _Grad(fun, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy, True)


# --- checkpoint / remat --------------------------------------------------------------------------


class _CheckpointRunner(_lift.Runner):
    """The function ``jax.checkpoint`` wraps: of an ``_ArgsBox`` of the call's distinct leaves
    (its key: the structure with sharing and the static arguments), returning the lifted
    function's :class:`~treeclone._lift.Out`. ``jax.checkpoint`` caches its trace by that
    structure; the plan comes back in its output structure either way."""

    traced_for = "checkpoint / remat"

    def __call__(self, box: _ArgsBox) -> _lift.Out:
        sdef, statics = box.key
        plan, outputs = self.trace(sdef, list(box.leaves), statics)
        return _lift.Out(_lift.Record(plan), outputs)


class _Checkpoint(_lift.Wrapper):
    """What :func:`checkpoint` returns (see there)."""

    name = "checkpoint"

    def __init__(
        self,
        fun: Callable[..., Any],
        policy: PolicySpec | ArgPolicies,
        jax_options: dict[str, Any],
        static_argnums: tuple[int, ...],
        static_argnames: tuple[str, ...],
    ):
        functools.update_wrapper(self, fun, updated=())  # name, doc, __wrapped__; first
        self._fun, self._options = fun, jax_options
        self._policy = as_policy_spec(policy, fun)
        self._static_nums, self._static_names = static_argnums, static_argnames
        clone_options = dict(jax_options)
        if static_argnums:
            clone_options["static_argnums"] = static_argnums
        if static_argnames:
            clone_options["static_argnames"] = static_argnames
        self._jax = jax.checkpoint(
            reporting(fun, frozenset(static_argnums), frozenset(static_argnames)), **clone_options
        )
        self._naming = _Naming(fun)
        self._lifted: dict[Policy | ArgPolicies, tuple[_CheckpointRunner, Callable[..., Any]]] = {}
        self._lock = threading.Lock()

    def _runner(self, policy: Policy | ArgPolicies) -> tuple[_CheckpointRunner, Callable[..., Any]]:
        entry = self._lifted.get(policy)
        if entry is None:
            with self._lock:
                runner = _CheckpointRunner(self._fun, policy, self._naming)
                options = dict(self._options)
                if not isinstance(options.get("prevent_cse", True), bool):
                    options.pop("prevent_cse")  # per argument: given at each call (below)
                entry = self._lifted.setdefault(policy, (runner, jax.checkpoint(runner, **options)))
        return entry

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = _policy_of(self._policy)
        if policy is CLONE:
            _lift.check_call(self._naming, args, kwargs, self._static_nums, self._static_names)
            return self._jax(*args, **kwargs)
        for d in self._static_nums:
            if not -len(args) <= d < len(args):
                raise ValueError(
                    "the `static_argnums` argument to `jax.checkpoint` / `jax.remat` can only "
                    "take integer values greater than or equal to `-len(args)` and less than "
                    f"`len(args)`, but got {self._static_nums}, while `len(args)` = {len(args)}"
                )
        call = _lift.flatten_call(self._naming, args, kwargs, self._static_nums, self._static_names)
        box = _ArgsBox(call.leaves, (call.sdef, call.statics))
        runner, checkpointed = self._runner(policy)
        prevent_cse = self._options.get("prevent_cse", True)
        if not isinstance(prevent_cse, bool):
            checkpointed = self._per_leaf_cse(runner, call, prevent_cse)
        names = call.slot_names(self._naming) if DebugInfo is not None else None
        with runner.calling(call.objects, names):
            out = checkpointed(box)
        return out.record.plan.apply(call.leaves, call.objects, out.leaves)

    def _per_leaf_cse(
        self, runner: _CheckpointRunner, call: _lift.Call, prevent_cse: tuple
    ) -> Callable[..., Any]:
        """``jax.checkpoint`` of ``runner`` with a per-argument ``prevent_cse`` turned into one
        flag per distinct leaf (True where any place of that leaf has True). ``jax.checkpoint``
        keys its trace cache on ``runner``, so the trace is still reused."""
        cse_args = (call.args, call.kwargs) if call.kwargs else call.args
        flags = jax.tree_util.tree_leaves(
            jax.tree_util.tree_map(
                lambda flag, subtree: jax.tree_util.tree_map(lambda _: flag, subtree),
                tuple(prevent_cse),
                cse_args,
            )
        )
        where: dict[int, bool] = {}
        for leaf, flag in zip(jax.tree_util.tree_leaves(cse_args), flags, strict=True):
            where[id(leaf)] = where.get(id(leaf), False) or bool(flag)
        per_slot = [where.get(id(x), True) for x in call.leaves]
        options = dict(self._options)
        options["prevent_cse"] = (_ArgsBox(per_slot, (call.sdef, call.statics)),)
        return jax.checkpoint(runner, **options)


@overload
def checkpoint(
    fun: Callable[..., Any],
    *,
    prevent_cse: bool | Sequence[bool] = True,
    policy: PolicySpec | ArgPolicies | Callable[..., bool] | None = "clone",
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Sequence[str] = (),
    remat_policy: Callable[..., bool] | None = None,
) -> Callable[..., Any]: ...
@overload
def checkpoint(
    fun: None = None,
    *,
    prevent_cse: bool | Sequence[bool] = True,
    policy: PolicySpec | ArgPolicies | Callable[..., bool] | None = "clone",
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Sequence[str] = (),
    remat_policy: Callable[..., bool] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def checkpoint(
    fun: Callable[..., Any] | None = None,
    *,
    prevent_cse: bool | Sequence[bool] = True,
    policy: PolicySpec | ArgPolicies | Callable[..., bool] | None = "clone",
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Sequence[str] = (),
    remat_policy: Callable[..., bool] | None = None,
) -> Callable[..., Any] | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``jax.checkpoint(fun, ...)`` (also ``treeclone.remat``) with a policy.

    ``policy`` is treeclone's, as for every treeclone transformation; JAX's rematerialization
    policy (``jax.checkpoint``'s own ``policy``, such as
    ``jax.checkpoint_policies.dots_saveable``) is ``remat_policy``. Since treeclone's policy is
    a name or a :class:`~treeclone.Policy` and JAX's is a callable, ``policy=<callable>`` (or
    None) is read as JAX's and the call is ``clone``, so code written for ``jax.checkpoint``
    runs unchanged; giving a callable both ways is a TypeError. ``prevent_cse``,
    ``static_argnums`` and ``static_argnames`` are ``jax.checkpoint``'s. Without ``fun``, the
    decorator that applies these options.

    Under ``alias`` the function's in-place mutations reach the caller (a checkpointed
    function is transparent to the policy) and gradients through it are
    ``jax.checkpoint``'s; under ``strict`` an input mutated and not returned is a
    :class:`~treeclone.MutationError`.

    >>> import jax, jax.numpy as jnp, treeclone
    >>> def layer(x, state):
    ...     state["calls"] = state["calls"] + 1
    ...     return jnp.sin(x) * 2.0
    >>> state = {"calls": jnp.zeros(())}
    >>> saveable = jax.checkpoint_policies.dots_saveable
    >>> f = treeclone.checkpoint(layer, policy="alias", remat_policy=saveable)
    >>> f(jnp.zeros(()), state), state
    (Array(0., dtype=float32), {'calls': Array(1., dtype=float32)})
    >>> treeclone.grad(f, policy="alias")(jnp.zeros(()), state), state
    (Array(2., dtype=float32), {'calls': Array(2., dtype=float32)})
    """
    if policy is None or (callable(policy) and not isinstance(policy, (str, Policy, Mapping))):
        if remat_policy is not None:
            raise TypeError(
                "checkpoint() got JAX's rematerialization policy both as policy= and as "
                "remat_policy=; give it as remat_policy= and treeclone's policy as policy="
            )
        remat_policy, policy = policy, "clone"
    chosen: PolicySpec | ArgPolicies = policy  # type: ignore[assignment]  # not JAX's: ours
    if not isinstance(chosen, (Mapping, ArgPolicies)):
        as_policy(chosen)  # an unknown name: an error now, not when the decorator is applied
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    options: dict[str, Any] = {"prevent_cse": prevent_cse}
    if remat_policy is not None:
        options["policy"] = remat_policy
    nums, names = tuple(static_argnums), tuple(static_argnames)
    if fun is None:
        return lambda f: _Checkpoint(f, chosen, options, nums, names)
    return _Checkpoint(fun, chosen, options, nums, names)


remat = checkpoint
