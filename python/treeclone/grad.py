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

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast, overload

import jax
import jax.numpy as jnp
import numpy as np

from treeclone import _lift, _native
from treeclone._jax_compat import DebugInfo
from treeclone._lift import ArgsBox, Naming, is_array, reporting
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy_spec,
    policy_override,
)

__all__ = ["grad", "value_and_grad"]


def _policy_of(default: Policy | ArgPolicies) -> Policy | ArgPolicies:
    return policy_override.get() or default  # a block's policy wins over a dict, as for jit


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


# --- what is differentiated (grad's ``wrt=``) ----------------------------------------------------


def _is_inexact_array(x: Any) -> bool:
    """Equinox's ``eqx.is_inexact_array``: a JAX or NumPy array of a floating or complex dtype."""
    return is_array(x) and jax.dtypes.issubdtype(x.dtype, np.inexact)


class _Wrt:
    """A ``wrt=`` resolved once: ``kind`` is ``"arrays"`` (equinox's rule), ``"nnx"`` (an nnx
    filter, ``predicate(path, variable)`` over the Variables; ``given`` is the filter as
    given, for ``nnx.state``) or ``"leaf"`` (the user's ``predicate(key_path, leaf)``)."""

    __slots__ = ("given", "kind", "predicate")

    def __init__(self, kind: str, predicate: Callable[[Any, Any], bool] | None, given: Any):
        self.kind, self.predicate, self.given = kind, predicate, given


def _wrt_rule(wrt: Any) -> _Wrt | None:
    """Resolve ``grad(wrt=...)``; None: every leaf of the differentiated arguments."""
    if wrt is None:
        return None
    if isinstance(wrt, str) and wrt in ("arrays", "equinox"):
        return _Wrt("arrays", None, wrt)
    nnx_filter = isinstance(wrt, type) or not callable(wrt)
    nnx_filter = nnx_filter or type(wrt).__module__.startswith("flax.nnx.filterlib")
    if not nnx_filter:
        return _Wrt("leaf", wrt, wrt)
    try:
        from flax.nnx import filterlib
    except ImportError:
        raise TypeError(
            f"wrt={wrt!r}: a type or filter names nnx Variables and needs flax; without it give "
            "wrt='arrays' or a predicate (key_path, leaf) -> bool"
        ) from None
    return _Wrt("nnx", filterlib.to_predicate(wrt), wrt)


class _Fixed:
    """The leaves of a call that ``wrt=`` keeps out of the computation's inputs (not arrays:
    a function, a string, a Python number), by slot; in the ``ArgsBox`` key, so JAX never
    sees them as leaves. Compared by identity: ``jax.value_and_grad`` does not key on it."""

    __slots__ = ("values",)

    def __init__(self, values: dict[int, Any]):
        self.values = values

    def merge(self, mask: Sequence[bool], it_diff: Any, it_other: Any) -> list:
        """Every leaf in its slot: the differentiated, the boxed and the fixed ones."""
        values = self.values
        return [
            values[s] if s in values else next(it_diff) if d else next(it_other)
            for s, d in enumerate(mask)
        ]


def _untied(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with each array met again at another place replaced by a copy, so that every
    place is its own input: under ``clone`` (rule 29) a gradient with ``wrt=`` is
    ``jax.grad``'s and ``eqx.filter_grad``'s, one per place, not the total of the places (the
    lift flattens with identity). The call itself when no array is at two places."""
    try:
        leaves, treedef = _native.flatten((args, kwargs))
    except ValueError:  # a cycle: the lift's flatten raises it, naming the argument
        return args, kwargs
    seen: set[int] = set()
    untied, copied = [], False
    for x in leaves:
        if id(x) in seen and isinstance(x, (jax.Array, np.ndarray)):
            x, copied = (x.copy() if isinstance(x, np.ndarray) else jnp.array(x, copy=True)), True
        seen.add(id(x))
        untied.append(x)
    if not copied:
        return args, kwargs
    return treedef.unflatten(untied)


def _variable_slots(call: _lift.Call, variables: Sequence[Any]) -> dict[int, list[int]]:
    """For each of ``variables`` (nnx Variables, by id), the slots of its leaves in the call,
    found through the caller's object at each node of the flattened call."""
    wanted = {id(v) for v in variables}
    found: dict[int, list[int]] = {}
    for node, obj in enumerate(call.objects):
        if id(obj) in wanted and id(obj) not in found:
            found[id(obj)] = [s for slots in call.sdef.child_slots(node) for s in slots]
    return found


def _nnx_selection(
    rule: _Wrt, call: _lift.Call, argnums: tuple[int, ...]
) -> tuple[set[int], list[Any], dict[int, list[int]]]:
    """Under an nnx filter: the slots differentiated (the values of the Variables
    ``nnx.state(arg, wrt)`` holds), per argument the gradient's template (that State, for an
    nnx graph node; None: the argument's structure) and the Variables' slots."""
    from flax import nnx

    chosen: set[int] = set()
    forms: list[Any] = []
    variables: list[Any] = []
    for i in argnums:
        arg = call.args[i]
        if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(arg)):
            forms.append(None)  # an array: no Variable to find (nnx.state fails on one)
            continue
        # nnx.state holds the caller's own Variables (the same objects), shared ones once.
        state = nnx.state(arg, rule.given)
        forms.append(state if nnx.graph.is_graph_node(arg) else None)
        variables += jax.tree_util.tree_leaves(state, is_leaf=_is_variable)
    var_slots = _variable_slots(call, variables)
    for slots in var_slots.values():
        chosen.update(slots)
    return chosen, forms, var_slots


def _is_variable(x: Any) -> bool:
    from flax import nnx

    return isinstance(x, nnx.Variable)


def _leaf_selection(
    rule: _Wrt, call: _lift.Call, argnums: tuple[int, ...], per_arg: list[list[int]]
) -> set[int]:
    """The slots a leaf rule differentiates: equinox's (inexact arrays) or the user's
    predicate on each leaf's key path in its argument and the leaf."""
    slots = {s for i in argnums for s in per_arg[i]}
    if rule.kind == "arrays":
        return {s for s in slots if _is_inexact_array(call.leaves[s])}
    predicate = cast(Callable[[Any, Any], bool], rule.predicate)
    chosen: set[int] = set()
    for i in argnums:
        picked = {
            id(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(call.args[i])[0]
            if predicate(path, leaf)
        }
        chosen.update(s for s in per_arg[i] if id(call.leaves[s]) in picked)
    return chosen


def _wrt_selection(
    rule: _Wrt, call: _lift.Call, argnums: tuple[int, ...], per_arg: list[list[int]]
) -> tuple[list[int], _Fixed | None, list[Any], dict[int, list[int]]]:
    """What ``wrt=`` differentiates in a call: the slots (sorted), the leaves of the
    differentiated arguments kept out of the computation (not arrays), per argument the
    gradient's template (see :func:`_nnx_selection`) and, under nnx, the Variables' slots."""
    forms: list[Any] = [None] * len(argnums)
    var_slots: dict[int, list[int]] = {}
    if rule.kind == "nnx":
        chosen, forms, var_slots = _nnx_selection(rule, call, argnums)
    else:
        chosen = _leaf_selection(rule, call, argnums, per_arg)
    # A leaf left out that is not an array is static: JAX never sees it (no TypeError).
    fixed = {
        s: call.leaves[s]
        for i in argnums
        for s in per_arg[i]
        if s not in chosen and not is_array(call.leaves[s])
    }
    return sorted(chosen), _Fixed(fixed) if fixed else None, forms, var_slots


def _nnx_grads(state: Any, var_slots: dict[int, list[int]], grad_of: dict[int, Any]) -> Any:
    """``nnx.grad``'s form: ``state`` (the caller's Variables that ``wrt`` names, shared ones
    once) with each Variable rebuilt around the gradient of its leaves (``grad_of``: by
    slot)."""

    def one(var: Any) -> Any:
        treedef = jax.tree_util.tree_structure(var)
        return jax.tree_util.tree_unflatten(treedef, [grad_of[s] for s in var_slots[id(var)]])

    return jax.tree_util.tree_map(one, state, is_leaf=_is_variable)


def _filtered_grads(
    structure: Sequence[tuple[Any, list[int]]],
    grads_flat: Sequence[Any],
    forms: Sequence[Any],
    diff_slots: Sequence[int],
    var_slots: dict[int, list[int]] | None,
) -> tuple:
    """The gradient of each differentiated argument under ``wrt=``: ``nnx.grad``'s State where
    ``forms`` has one, else the argument's structure with None at the leaves left out (what
    ``eqx.filter_grad`` returns)."""
    grads = []
    for (treedef, where), form in zip(structure, forms, strict=True):
        if form is None:
            grads.append(treedef.unflatten([None if j < 0 else grads_flat[j] for j in where]))
        else:
            grad_of = dict(zip(diff_slots, grads_flat, strict=True))
            grads.append(_nnx_grads(form, var_slots or {}, grad_of))
    return tuple(grads)


class _GradRunner(_lift.Runner):
    """The function ``jax.value_and_grad(..., argnums=0, has_aux=True)`` differentiates: of the
    distinct leaves of the differentiated arguments, with the other leaves and the call's key
    in an ``ArgsBox``. It returns the value to differentiate and, as JAX's aux output (so it
    comes back concrete), the lifted function's :class:`~treeclone._lift.Out`, whose record's
    ``extra`` says where the gradients go: per differentiated argument, JAX's structure of it
    and, per leaf of that structure, the differentiated input it is (-1: a leaf ``wrt=`` leaves
    out). Under ``wrt=`` the key also holds the leaves kept out of the computation
    (:class:`_Fixed`)."""

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
                    f"{self.naming.name(i)}: the pytree's unflatten does not keep the "
                    "leaves it is given (it converts or copies them), so its gradient "
                    "cannot be matched to its leaves under this policy; use policy='clone'"
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
        return value, _lift.Out(_lift.Record(plan.plan, tuple(structure)), self.outputs(plan))


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
        wrt: Any = None,
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
        self._wrt = _wrt_rule(wrt)
        self._argnums = _check_argnums(argnums)
        self._single = not isinstance(argnums, Sequence)
        self._has_aux, self._with_value = has_aux, with_value
        self._holomorphic, self._allow_int = holomorphic, allow_int
        self._fun = fun
        self._naming = Naming(fun)
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
        if policy is CLONE and self._wrt is None:  # jax.grad cannot filter: wrt= lifts
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
        if (
            self._wrt is not None
            and self._wrt.kind != "nnx"  # nnx's own rule: a Variable is one parameter
            and isinstance(policy, Policy)
            and policy.identity == "duplicate"
        ):
            args, kwargs = _untied(args, kwargs)
        call = _lift.flatten_call(self._naming, args, kwargs)
        per_arg = call.arg_slots()
        fixed, forms, var_slots = None, None, None
        if self._wrt is None:
            diff_slots = sorted({s for i in argnums for s in per_arg[i]})
        else:
            diff_slots, fixed, forms, var_slots = _wrt_selection(self._wrt, call, argnums, per_arg)
        for s in diff_slots:
            problem = _dtype_problem(call.leaves[s], self._holomorphic, self._allow_int)
            if problem is not None:
                raise TypeError(f"{call.slot_path(self._naming, s)}: {problem}.")
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
            grads = _filtered_grads(out.record.extra, grads_flat, forms, diff_slots, var_slots)
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
    wrt: Any = None,
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
    wrt: Any = None,
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
    wrt: Any = None,
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
        return lambda f: grad(
            f, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy=policy, wrt=wrt
        )
    return _Grad(fun, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy, False, wrt)


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
    wrt: Any = None,
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
    wrt: Any = None,
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
    wrt: Any = None,
) -> Callable[..., tuple[Any, Any]] | Callable[[Callable[..., Any]], Callable[..., Any]]:
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
        return lambda f: value_and_grad(
            f, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy=policy, wrt=wrt
        )
    return _Grad(fun, argnums, has_aux, holomorphic, allow_int, reduce_axes, policy, True, wrt)
