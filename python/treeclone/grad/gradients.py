"""``treeclone.grad`` and ``value_and_grad`` with a policy.

Each takes the JAX function's arguments plus ``policy=``: ``"clone"`` (the default: the call
is the JAX transformation's own, the same object does the work), ``"alias"`` (in-place
mutations of the inputs reach the caller's objects as in plain Python, as concrete arrays),
``"strict"`` (an input mutated and not returned is a :class:`~treeclone.MutationError` naming
the argument and key path) or a :class:`~treeclone.Policy`. A ``with treeclone.policy(...)``
block overrides the policy of every call made inside it, as for ``treeclone.jit``.

Under a policy other than ``clone`` the call is flattened with identity (the same array passed
twice is one input; a shared container is one object inside), the function runs on the
arguments rebuilt from the JAX transformation's tracers, and what it did comes back as a plan
that rebuilds the result and writes mutations back (``treeclone._lift``). The transformations nest
with each other and with ``treeclone.jit`` in any order. ``docs/semantics.md`` states the
rules and names their tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from treeclone import _lift
from treeclone._docs import see
from treeclone._jax_compat import DebugInfo
from treeclone._lift import ArgsBox, Naming, reporting
from treeclone.grad.wrt import filtered_grads, untied, wrt_hint, wrt_rule, wrt_selection
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
)

__all__ = ["grad", "value_and_grad"]


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
    in an ``ArgsBox``. It returns the value to differentiate and, as JAX's aux output (so it
    comes back concrete), the lifted function's :class:`~treeclone._lift.Out`, whose record's
    ``extra`` says where the gradients go: per differentiated argument, JAX's structure of it
    and, per leaf of that structure, the differentiated input it is (-1: a leaf ``wrt=`` leaves
    out). Under ``wrt=`` the key also holds the leaves kept out of the computation
    (:class:`Fixed`)."""

    traced_for = "vjp"

    def __init__(
        self, fun: Callable[..., Any], policy: Policy | ArgPolicies, naming: Naming, has_aux: bool
    ):
        super().__init__(fun, policy, naming)
        self.has_aux = has_aux

    def __call__(self, diff: list, box: ArgsBox) -> tuple[Any, _lift.Out]:
        sdef, mask, argnums, fixed, filtered = box.key
        it_diff, it_other = iter(diff), iter(box.leaves)
        if fixed is None:
            leaves = [next(it_diff) if d else next(it_other) for d in mask]
        else:
            leaves = fixed.merge(mask, it_diff, it_other)
        # -1: a leaf of a differentiated argument that ``wrt=`` leaves out (a None gradient).
        index = dict.fromkeys(map(id, leaves), -1) if filtered else {}
        index.update({id(x): j for j, x in enumerate(diff)})
        prepared = self.begin(sdef, leaves)
        structure = []
        for i in argnums:
            flat, treedef = jax.tree_util.tree_flatten(prepared.args[i])
            try:
                structure.append((treedef, [index[id(x)] for x in flat]))
            except KeyError:
                raise TypeError(
                    see(
                        "not-differentiable",
                        f"{self.naming.name(i)}: the pytree's unflatten does not keep the "
                        "leaves it is given (it converts or copies them), so its gradient "
                        "cannot be matched to its leaves under this policy; use policy='clone'",
                    )
                ) from None
        called = prepared.call()
        out = called.out
        if self.has_aux and not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(
                "expected function with aux output to return a two-element tuple, but "
                f"got type {type(out)} with value {out!r}"
            )
        plan = called.diff().plan()
        value = out[0] if self.has_aux else out
        return value, _lift.Out(_lift.LiftRecord(plan.plan, tuple(structure)), self.outputs(plan))


def _grad_options(
    argnums: Any, has_aux: bool, holomorphic: bool, allow_int: bool, reduce_axes: Any
) -> dict[str, Any]:
    """``jax.grad``'s options as given (``reduce_axes`` only when given: jax's own error, or
    meaning on a JAX that still has it)."""
    options = {"argnums": argnums, "has_aux": has_aux}
    options.update(holomorphic=holomorphic, allow_int=allow_int, reduce_axes=reduce_axes)
    return options


class _Grad(_lift.Wrapper):
    """What :func:`grad` and :func:`value_and_grad` return (see there)."""

    jax_checks_first = True  # a bad option is jax's own error, under every policy

    def __init__(
        self,
        fun: Callable[..., Any],
        options: dict[str, Any],
        policy: PolicySpec | ArgPolicies,
        with_value: bool,
        wrt: Any = None,
    ):
        """``options``: ``jax.grad``'s (``argnums``, ``has_aux``, ``holomorphic``,
        ``allow_int``, ``reduce_axes``)."""
        argnums, has_aux = options["argnums"], options["has_aux"]
        holomorphic, allow_int = options["holomorphic"], options["allow_int"]
        self._jax_options = {k: v for k, v in options.items() if k != "reduce_axes" or v}
        self._with_value = with_value
        super().__init__(fun, policy)
        self._wrt = wrt_rule(wrt)
        self._argnums = _check_argnums(argnums)
        self._single = not isinstance(argnums, Sequence)
        self._has_aux = has_aux
        self._holomorphic, self._allow_int = holomorphic, allow_int

    def make_jax(self) -> Callable[..., Any]:
        transform = jax.value_and_grad if self._with_value else jax.grad
        return transform(reporting(self._fun), **self._jax_options)

    @property
    def name(self) -> str:  # type: ignore[override]
        return "value_and_grad" if self._with_value else "grad"

    def make_runner(self, policy: Policy | ArgPolicies) -> tuple[_GradRunner, Callable[..., Any]]:
        runner = _GradRunner(self._fun, policy, self._naming, self._has_aux)
        vg = jax.value_and_grad(
            runner,
            argnums=0,
            has_aux=True,
            holomorphic=self._holomorphic,
            allow_int=self._allow_int,
        )
        return runner, vg

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = self._policy_now()
        if policy is CLONE and self._wrt is None:  # jax.grad cannot filter: wrt= lifts
            _lift.check_cycles(self._naming, args, kwargs)  # a cycle: rule J17's ValueError
            try:
                return self._jax(*args, **kwargs)
            except TypeError:
                self._check_dtypes(args, kwargs)  # a leaf jax.grad refuses: named, with wrt=
                raise
        argnums = self._resolve_argnums(len(args))
        if (
            self._wrt is not None
            and self._wrt.kind != "nnx"  # nnx's own rule: a Variable is one parameter
            and isinstance(policy, Policy)
            and policy.identity == "duplicate"
        ):
            args, kwargs = untied(args, kwargs)
        call = _lift.flatten_call(self._naming, args, kwargs)
        per_arg = call.arg_slots()
        fixed, forms, var_slots = None, None, None
        if self._wrt is None:
            diff_slots = sorted({s for i in argnums for s in per_arg[i]})
        else:
            diff_slots, fixed, forms, var_slots = wrt_selection(self._wrt, call, argnums, per_arg)
        self._refuse(call, diff_slots, args, argnums)
        chosen = set(diff_slots)
        mask = tuple(s in chosen for s in range(len(call.leaves)))
        diff = [call.leaves[s] for s in diff_slots]
        kept = chosen if fixed is None else chosen | fixed.values.keys()
        others = [x for s, x in enumerate(call.leaves) if s not in kept]
        box = ArgsBox(others, (call.sdef, mask, argnums, fixed, self._wrt is not None))
        runner, vg = self._runner(policy)
        slot_names = call.slot_names(self._naming) if DebugInfo is not None else None
        names = None if slot_names is None else [slot_names[s] for s in diff_slots]
        with runner.calling(call.objects, names):
            (_, out), grads_flat = vg(diff, box)
        result = out.record.plan.apply(call.leaves, call.objects, out.leaves)
        if forms is None:
            grads = tuple(
                treedef.unflatten([grads_flat[j] for j in where])
                for treedef, where in out.record.extra
            )
        else:
            grads = filtered_grads(out.record.extra, grads_flat, forms, diff_slots, var_slots)
        grad_value = grads[0] if self._single else grads
        if self._with_value:
            return result, grad_value
        if self._has_aux:
            return grad_value, result[1]
        return grad_value

    def _resolve_argnums(self, n: int) -> tuple[int, ...]:
        """``argnums`` for a call with ``n`` positional arguments (jax.grad's TypeError)."""
        if max(self._argnums, default=-1) >= n or min(self._argnums, default=0) < -n:
            raise TypeError(
                f"differentiating with respect to argnums={self._given_argnums()} requires at "
                f"least {max(max(self._argnums) + 1, -min(self._argnums))} positional arguments "
                f"to be passed by the caller, but got only {n} positional arguments."
            )
        return tuple(i + n if i < 0 else i for i in self._argnums)

    def _refuse(self, call: Any, diff_slots: Sequence[int], args: tuple, argnums: Any) -> None:
        """jax.grad's TypeError for a differentiated leaf it refuses, naming its key path and,
        where it is an integer or a key, the ``wrt=`` that leaves it out."""
        for s in diff_slots:
            problem = _dtype_problem(call.leaves[s], self._holomorphic, self._allow_int)
            if problem is not None:
                hint = wrt_hint(args, argnums) if "allow_int" in problem else ""
                raise TypeError(
                    see(
                        "not-differentiable", f"{call.slot_path(self._naming, s)}: {problem}{hint}."
                    )
                )

    def _check_dtypes(self, args: tuple, kwargs: dict) -> None:
        """Under ``clone``, after ``jax.grad`` raised a TypeError: the named error of
        :meth:`_refuse` when a differentiated leaf is one it refuses (else nothing)."""
        try:
            argnums = self._resolve_argnums(len(args))
            call = _lift.flatten_call(self._naming, args, kwargs)
        except Exception:  # noqa: BLE001 - jax.grad's own error stands
            return
        per_arg = call.arg_slots()
        diff_slots = sorted({s for i in argnums for s in per_arg[i]})
        self._refuse(call, diff_slots, args, argnums)

    def _given_argnums(self) -> Any:
        return self._argnums[0] if self._single else self._argnums


@_lift.fun_or_decorator
def grad(
    fun: Callable[..., Any] | None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    wrt: Any = None,
) -> Callable[..., Any] | _lift.Decorator[Callable[..., Any]]:
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

    ``wrt`` (keyword only) names the leaves of the ``argnums`` arguments that are
    differentiated; the others are carried as JAX carries a non-differentiated argument (an
    integer leaf needs no ``allow_int``; under ``alias`` its in-place updates reach the caller)
    and a leaf that is not an array (a function, a string) is kept out of the computation.
    Under ``clone`` a call with ``wrt`` goes through treeclone's lift (``jax.grad`` cannot
    filter); the caller's objects are left as they were. ``wrt`` is one of:

    * None (the default): every leaf, ``jax.grad``'s rule and gradient;
    * a type such as ``nnx.Param``, an nnx filter object, or anything
      ``flax.nnx.filterlib.to_predicate`` accepts: the values of the Variables that
      ``nnx.state(arg, wrt)`` holds. For an nnx Module the gradient is what ``nnx.grad``
      returns, that ``nnx.State`` (a shared Variable once), which
      ``nnx.Optimizer.update(model, grads)`` takes; for another argument, its structure with
      None at the other leaves;
    * ``"arrays"`` (or ``"equinox"``): equinox's rule, the floating JAX and NumPy arrays; the
      gradient is the argument's structure with None at the other leaves, what
      ``eqx.filter_grad`` returns (``eqx.apply_updates`` and optax take it);
    * a predicate ``(key_path, leaf) -> bool`` (JAX's key path within the argument): the leaves
      it accepts; the gradient is the argument's structure with None at the others.

    >>> import jax.numpy as jnp, treeclone
    >>> def scaled(tree):
    ...     return jnp.sum(tree["w"] * tree["scale"]) * len(tree["name"])
    >>> tree = {"w": jnp.array([1.0, 2.0]), "scale": jnp.array(3), "name": "ab"}
    >>> treeclone.grad(scaled, wrt="arrays")(tree)  # an int array and a string: carried
    {'name': None, 'scale': None, 'w': Array([6., 6.], dtype=float32)}
    >>> treeclone.grad(scaled, wrt=lambda path, leaf: path[0].key == "w")(tree)
    {'name': None, 'scale': None, 'w': Array([6., 6.], dtype=float32)}

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
        return _lift.Decorator(
            grad, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy=policy, wrt=wrt
        )
    options = _grad_options(argnums, has_aux, holomorphic, allow_int, reduce_axes)
    return _Grad(fun, options, policy, False, wrt)


@_lift.fun_or_decorator
def value_and_grad(
    fun: Callable[..., Any] | None = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    reduce_axes: Sequence[Any] = (),
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    wrt: Any = None,
) -> Callable[..., tuple[Any, Any]] | _lift.Decorator[Callable[..., tuple[Any, Any]]]:
    """``jax.value_and_grad(fun, ...)`` with a policy: a call returns ``(value, grads)``, or
    ``((value, aux), grads)`` with ``has_aux``, where ``value`` and ``aux`` are the function's
    result rebuilt as under ``treeclone.jit`` (under ``alias`` a returned input is the
    caller's same object) and ``grads`` are as for :func:`grad` (``wrt`` included: with
    ``wrt=nnx.Param`` a call is ``nnx.value_and_grad``'s, with ``wrt="arrays"``
    ``eqx.filter_value_and_grad``'s).

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
        return _lift.Decorator(
            value_and_grad,
            argnums,
            has_aux,
            holomorphic,
            allow_int,
            reduce_axes,
            policy=policy,
            wrt=wrt,
        )
    options = _grad_options(argnums, has_aux, holomorphic, allow_int, reduce_axes)
    return _Grad(fun, options, policy, True, wrt)
