"""``treeclone.checkpoint`` (``remat``) with a policy.

It takes ``jax.checkpoint``'s arguments plus ``policy=``: ``"clone"`` (the default: the call is
``jax.checkpoint``'s own), ``"alias"`` (in-place mutations of the inputs reach the caller's
objects as in plain Python, as concrete arrays), ``"strict"`` (an input mutated and not
returned is a :class:`~treeclone.MutationError` naming the argument and key path) or a
:class:`~treeclone.Policy`. Under a policy other than ``clone`` the call goes through the lift
(``treeclone._lift``), as every transformation's does; ``docs/semantics.md`` ("grad,
value_and_grad and checkpoint") states the rules and names their tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from treeclone import _lift
from treeclone._docs import see
from treeclone._lift import ArgsBox, leaf_rule, reporting
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy,
)

__all__ = ["checkpoint", "remat"]


class _CheckpointRunner(_lift.Runner):
    """The function ``jax.checkpoint`` wraps: of an ``ArgsBox`` of the call's distinct leaves
    (its key: the structure with sharing and the static arguments), returning the lifted
    function's :class:`~treeclone._lift.Out`. ``jax.checkpoint`` caches its trace by that
    structure; the plan comes back in its output structure either way."""

    traced_for = "checkpoint / remat"

    def __call__(self, box: ArgsBox) -> _lift.Out:
        sdef, statics, static = box.key
        plan = self.begin(sdef, list(box.leaves), statics, static).call().diff().plan()
        return _lift.Out(_lift.LiftRecord(plan.plan), self.outputs(plan))


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
        traced: Callable[[Any], bool] | None,
    ):
        self._options, self._traced = jax_options, traced
        self._static_nums, self._static_names = static_argnums, static_argnames
        super().__init__(fun, policy)
        self._statics = frozenset(static_argnums), frozenset(static_argnames)

    def make_jax(self) -> Callable[..., Any]:
        clone_options = dict(self._options)
        if self._static_nums:
            clone_options["static_argnums"] = self._static_nums
        if self._static_names:
            clone_options["static_argnames"] = self._static_names
        statics = frozenset(self._static_nums), frozenset(self._static_names)
        return jax.checkpoint(reporting(self._fun, *statics), **clone_options)

    def make_runner(
        self, policy: Policy | ArgPolicies
    ) -> tuple[_CheckpointRunner, Callable[..., Any]]:
        runner = _CheckpointRunner(self._fun, policy, self._naming, self._traced)
        options = dict(self._options)
        if not isinstance(options.get("prevent_cse", True), bool):
            options.pop("prevent_cse")  # per argument: given at each call (below)
        return runner, jax.checkpoint(runner, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = self._policy_now()
        if policy is CLONE and self._traced is None:  # jax.checkpoint cannot leave leaves static
            _lift.check_cycles(self._naming, args, kwargs, *self._statics)
            return self._jax(*args, **kwargs)
        for d in self._static_nums:
            if not -len(args) <= d < len(args):
                raise ValueError(
                    "the `static_argnums` argument to `jax.checkpoint` / `jax.remat` can only "
                    "take integer values greater than or equal to `-len(args)` and less than "
                    f"`len(args)`, but got {self._static_nums}, while `len(args)` = {len(args)}"
                )
        call = _lift.flatten_call(
            self._naming, args, kwargs, self._static_nums, self._static_names, self._traced
        )
        box = ArgsBox(call.traced_leaves(), (call.sdef, call.statics, call.static))
        runner, checkpointed = self._runner(policy)
        prevent_cse = self._options.get("prevent_cse", True)
        if not isinstance(prevent_cse, bool):
            checkpointed = self._per_leaf_cse(runner, call, prevent_cse)
        names = call.input_names(self._naming)
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
        options["prevent_cse"] = (ArgsBox(per_slot, (call.sdef, call.statics, call.static)),)
        return jax.checkpoint(runner, **options)


@_lift.fun_or_decorator
def checkpoint(
    fun: Callable[..., Any] | None = None,
    *,
    prevent_cse: bool | Sequence[bool] = True,
    policy: PolicySpec | ArgPolicies | Callable[..., bool] | None = "clone",
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Sequence[str] = (),
    remat_policy: Callable[..., bool] | None = None,
    traced: str | Callable[[Any], bool] | None = None,
) -> Callable[..., Any] | _lift.Decorator[Callable[..., Any]]:
    """``jax.checkpoint(fun, ...)`` (also ``treeclone.remat``) with a policy.

    ``policy`` is treeclone's, as for every treeclone transformation; JAX's rematerialization
    policy (``jax.checkpoint``'s own ``policy``, such as
    ``jax.checkpoint_policies.dots_saveable``) is ``remat_policy``. Since treeclone's policy is
    a name or a :class:`~treeclone.Policy` and JAX's is a callable, ``policy=<callable>`` (or
    None) is read as JAX's and the call is ``clone``, so code written for ``jax.checkpoint``
    runs unchanged; giving a callable both ways is a TypeError. ``prevent_cse``,
    ``static_argnums`` and ``static_argnames`` are ``jax.checkpoint``'s. ``traced`` decides
    leaf by leaf what is traced, as for :func:`treeclone.jit` (``"arrays"``: equinox's rule,
    as ``eqx.filter_checkpoint``; the other leaves are static). Without ``fun``, the
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
                see(
                    "invalid-option",
                    "checkpoint() got JAX's rematerialization policy both as policy= and as "
                    "remat_policy=; give it as remat_policy= and treeclone's policy as policy=",
                )
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
    rule = leaf_rule(traced)
    if fun is None:
        return _lift.Decorator(_Checkpoint, chosen, options, nums, names, rule)
    return _Checkpoint(fun, chosen, options, nums, names, rule)


remat = checkpoint
