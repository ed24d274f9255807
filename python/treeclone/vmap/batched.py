"""``treeclone.vmap``: ``jax.vmap`` with a policy.

``treeclone.vmap(fun, in_axes, out_axes, axis_name, axis_size, spmd_axis_name, policy=...)``
takes ``jax.vmap``'s arguments, with their meanings, plus ``policy``: ``"clone"`` (the
default: a call is ``jax.vmap``'s own), ``"alias"``, ``"strict"`` or a
:class:`~treeclone.Policy`. Under ``alias`` the call stands for a Python loop over the batch:
each example runs ``fun`` on its slice of every mapped input (and on the whole of every input
mapped with ``None``); the state each example leaves in a mapped input is stacked back into
the caller's object along that input's axis, and a new value the function returns is stacked
along ``out_axes``. ``docs/semantics.md`` ("vmap") states the rules and names their tests.

Under a policy other than ``clone`` the call runs through the shared lift
(``treeclone._lift``): the arguments are flattened with identity (an array at two places is one
input, so it has one batch axis), ``jax.vmap`` maps the distinct leaves, and the function runs
on the arguments rebuilt from its tracers. The batch axis of every value the call produces is
worked out from where the value ends up (``ResultAxes``), once the function has run: state
written into an input takes that input's axis, results take ``out_axes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.core import Tracer

from treeclone import _lift
from treeclone._docs import see
from treeclone._jax_compat import BatchTracer as _BatchTracer
from treeclone._jax_compat import require
from treeclone._jax_compat import trace_ctx as _trace_ctx
from treeclone._lift import leaf_rule, reporting
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy,
)
from treeclone.vmap.axes import (
    InAxes,
    PlaceError,
    ResultAxes,
    check_sizes,
    container_ids,
    copy_returned_inputs,
)

__all__ = ["vmap"]


class _VmapRunner(_lift.Runner):
    """The function ``jax.vmap`` maps: of the list of a call's distinct leaves, returning the
    lifted function's :class:`~treeclone._lift.Out`. What the call needs besides the leaves
    (its structure, the axes) is this thread's current ``call`` (``jax.vmap`` traces at each
    call, within it: :meth:`~treeclone._lift.Runner.calling`)."""

    traced_for = "vmap"

    def __call__(self, leaves: list) -> _lift.Out:
        call, axes, out_axes, late = self.current_call()
        leaves = _lift.with_static(leaves, call.static)  # traced= left them out of JAX's sight
        traces = {
            id(getattr(x, "_trace", None))
            for x, a in zip(leaves, axes.slot_axes, strict=True)
            if a is not None and isinstance(x, require(_BatchTracer))
        }
        current = getattr(_trace_ctx, "trace", None)  # this vmap's trace (none mapped: the only)
        if current is not None:
            traces.add(id(current))
        rule = self.traced

        def static(x: Any) -> bool:
            return rule is not None and not isinstance(x, Tracer) and not rule(x)

        result_axes = ResultAxes(self.fun, axes, out_axes, leaves, traces, static)

        prepared = self.begin(call.sdef, list(leaves))
        # The containers the function gets: a returned one moved to another axis is copied.
        inputs = container_ids((prepared.args, prepared.kwargs))
        called = prepared.call()
        called.out = copy_returned_inputs(called.out, out_axes, leaves, axes, inputs, static)
        diffed = called.diff()
        plan = diffed.plan(forced=result_axes.forced(diffed))
        outputs = self.outputs(plan)
        if len(result_axes.out_list) != len(outputs):  # ResultAxes mirrors the plan's choice
            raise RuntimeError(
                f"treeclone.vmap: {len(outputs)} outputs but {len(result_axes.out_list)} axes for "
                "them (an internal error: please report it)"
            )
        record = _lift.LiftRecord(plan.plan)
        late.record, late.leaves = record, result_axes.out_list  # the out_axes, now known
        return _lift.Out(record, outputs)


class _Vmap(_lift.Wrapper):
    """What :func:`vmap` returns (see there)."""

    name = "vmap"
    jax_checks_first = True  # bad axes are jax.vmap's own errors, under every policy

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        axis_name: Any,
        axis_size: int | None,
        spmd_axis_name: Any,
        policy: PolicySpec | ArgPolicies,
        traced: Callable[[Any], bool] | None,
    ):
        self._traced = traced
        if isinstance(in_axes, list):
            in_axes = tuple(in_axes)  # as jax.vmap does
        self._options = {
            "axis_name": axis_name,
            "axis_size": axis_size,
            "spmd_axis_name": spmd_axis_name,
        }
        self._in_axes, self._out_axes = in_axes, out_axes
        super().__init__(fun, policy)

    def make_jax(self) -> Callable[..., Any]:
        return jax.vmap(
            reporting(self._fun), in_axes=self._in_axes, out_axes=self._out_axes, **self._options
        )

    def make_runner(self, policy: Policy | ArgPolicies) -> _VmapRunner:
        return _VmapRunner(self._fun, policy, self._naming, self._traced)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = self._policy_now()
        if policy is CLONE and self._traced is None:  # jax.vmap cannot leave leaves static
            _lift.check_cycles(self._naming, args, kwargs)  # a cycle: rule J17's ValueError
            return self._jax(*args, **kwargs)
        if isinstance(self._in_axes, tuple) and len(self._in_axes) != len(args):
            raise ValueError(
                "vmap in_axes must be an int, None, or a tuple of entries corresponding to the "
                "positional arguments passed to the function, but got "
                f"len(in_axes)={len(self._in_axes)}, len(args)={len(args)}"
            )
        call = _lift.flatten_call(self._naming, args, kwargs, traced=self._traced, hashed=False)
        axes = InAxes(call, self._naming, self._in_axes)
        if call.static is not None:  # a static leaf is one value for the batch: not mapped
            for s in call.static.slots:
                axes.slot_axes[s] = None
        check_sizes(call, axes, self._options["axis_size"])
        runner = self._runner(policy)
        late = _lift.Out(None, [])  # type: ignore[arg-type]  # filled in by the trace
        mapped = jax.vmap(runner, in_axes=(list(axes.slot_axes),), out_axes=late, **self._options)
        names = call.input_names(self._naming)
        with runner.calling(call.objects, names, (call, axes, self._out_axes, late)):
            try:
                out = mapped(list(call.traced_leaves()))
            except PlaceError as e:
                raise ValueError(str(e)) from None
            except ValueError as e:
                if not str(e).startswith("vmap has mapped output"):  # JAX's own, unnamed
                    raise
                raise ValueError(
                    see(
                        "vmap-write-back",
                        f"{e} (a value that varies along the batch was returned, or written "
                        "into an input, at a place whose axis is None)",
                    )
                ) from None
        return out.record.plan.apply(call.leaves, call.objects, out.leaves)


@_lift.fun_or_decorator
def vmap(
    fun: Callable[..., Any] | None = None,
    in_axes: Any = 0,
    out_axes: Any = 0,
    axis_name: Any = None,
    axis_size: int | None = None,
    spmd_axis_name: Any = None,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    traced: str | Callable[[Any], bool] | None = None,
) -> Callable[..., Any] | _lift.Decorator[Callable[..., Any]]:
    """``jax.vmap(fun, in_axes, out_axes, axis_name, axis_size, spmd_axis_name)`` with a
    policy.

    The arguments are ``jax.vmap``'s, with its meanings; without ``fun``, the decorator that
    applies them. Under ``clone`` a call is ``jax.vmap``'s own. Under ``alias`` a call is the
    Python loop over the batch that ``jax.vmap`` vectorizes, on the caller's objects:

    * an input mapped along an axis and mutated in place keeps its batch axis: each example's
      new state is stacked into the caller's object along that input's ``in_axes`` (a key
      added, a leaf replaced, for every example alike);
    * a value written into an input mapped with ``None`` must be the same for every example
      (it is written once); a batched one is a ``ValueError`` naming the key path, and
      nothing is written back;
    * values the function creates and returns are stacked along ``out_axes``; a returned
      input container is the caller's same object (its contents keep their ``in_axes``);
    * identity is preserved: an array reachable from two places is one input, mapped along
      one axis (two different axes for it are a ``ValueError`` naming both places).

    Under ``strict`` an input mutated and not returned is a :class:`~treeclone.MutationError`.

    ``traced`` decides leaf by leaf what is traced, as for :func:`treeclone.jit`
    (``"arrays"``: equinox's rule, as ``eqx.filter_vmap``): a leaf it leaves static (an
    activation function, a string) is never mapped, whatever ``in_axes`` says, and one the
    function returns comes back as it is.

    >>> import jax.numpy as jnp, treeclone
    >>> def step(state, x):
    ...     state["total"] = state["total"] + x  # per-example state, updated in place
    ...     return x * 2
    >>> state = {"total": jnp.zeros(3)}
    >>> treeclone.vmap(step, policy="alias")(state, jnp.arange(3.0))
    Array([0., 2., 4.], dtype=float32)
    >>> state
    {'total': Array([0., 1., 2.], dtype=float32)}
    >>> shared = {"total": jnp.zeros(())}
    >>> treeclone.vmap(step, in_axes=(None, 0), policy="alias")(shared, jnp.arange(3.0))
    Traceback (most recent call last):
    ...
    ValueError: state['total']: step wrote a batched value (one per example) into an input ...
    >>> shared
    {'total': Array(0., dtype=float32)}
    """
    if not isinstance(policy, (Mapping, ArgPolicies)):
        as_policy(policy)  # an unknown name: an error now, not when the decorator is applied
    options = (in_axes, out_axes, axis_name, axis_size, spmd_axis_name, policy, leaf_rule(traced))
    if fun is None:
        return _lift.Decorator(_Vmap, *options)
    return _Vmap(fun, *options)
