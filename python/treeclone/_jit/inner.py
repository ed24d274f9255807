"""The function ``treeclone.jit``'s inner ``jax.jit`` traces under a policy (:class:`Inner`):
it rebuilds a call's arguments from its distinct leaves, runs the user's function through the
lift (:func:`~treeclone._lift.begin` and ``_effects``'s steps) and returns the outputs boxed with
what the trace recorded (:class:`JitRecord`, the static data of a :class:`ResultBox`); and the
end of a call whose result needs Python (:func:`finish_lean`: an input handed back that is not
a ``jax.Array``, a write inside a JAX transformation).
"""

from __future__ import annotations

import functools
import operator
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.core import Tracer

from treeclone import _effects, _native, _retrace
from treeclone._jit.call import (
    JitCall,
    from_jit_order,
    is_static_slot,
    jit_order,
    lean_call_record,
)
from treeclone._jit.placement import (
    Placement,
    argument_leaves,
    pins,
    place_outputs,
    shardings,
)
from treeclone._lift import Naming, Runner, as_jit_outputs, begin, jit_keystr
from treeclone.policies import ArgPolicies, Policy

# Options that treeclone handles itself under a non-clone policy (the rest go to jax.jit).
ARG_OPTIONS = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames")


SHARDINGS = ("in_shardings", "out_shardings")


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


class JitRecord:
    """What one trace under a policy recorded; the static data of its ``ResultBox``.

    ``plan``: the ``CallPlan``. ``paths``: for each output of the computation, where the user
    sees it (``['a']`` in the result, or an argument's key path for a value written back), the
    key JAX's messages about outputs print. ``out_tree`` and ``out_sources``: the function's
    own result rebuilt from the inputs (``("in", slot)``) and outputs (``("out", index)``), for
    ``lower``/``trace``/``eval_shape``; ``out_sources`` is None when it could not be worked out.
    ``next_inputs``: where the arguments' leaves are after a call (``_effects.writes.next_inputs``),
    for ``jit_partial``. ``returned_inputs``: under a policy that gives ``jax.jit``'s results
    (strict), the input slots the result hands back as they came in, each to be returned as
    the ``jax.Array`` ``jax.jit`` would return for it (see :func:`as_jit_outputs`); empty
    under alias, whose result is plain Python's (its plan checks rule J31 itself, as every
    lifted transformation's does: ``_effects.enclosing``). ``hold_inputs``: whether the lean
    path holds a call's leaves until the next call (their arrays are on a platform of
    ``HOLD_INPUT_PLATFORMS`` and total at most ``HOLD_INPUT_BYTES``). Compared by identity,
    as the plan is.
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
        self.static_outputs: tuple[tuple[int, Any], ...] = ()
        self.hold_inputs = False


# The inner jit's result: the outputs, with the trace's JitRecord as static data.
ResultBox = _native.ResultBox


def _result_keys(box: ResultBox) -> tuple[list, JitRecord]:
    # The key of each output is its path as the user sees it (a string: keystr prints it as is).
    return list(zip(box.info.paths, box.leaves, strict=True)), box.info


# jax rebuilds a ResultBox at every call: attrgetter and the native type do it without a
# Python frame (rebuilding the result as anything but a ResultBox would take jax.jit off its
# C++ fast path).
jax.tree_util.register_pytree_with_keys(
    ResultBox, _result_keys, ResultBox, operator.attrgetter("leaves", "info")
)


_native.invalidate_registry_cache()


def finish_lean(call: tuple, info: JitRecord, outputs: list) -> Any:
    """The end of a native call (``_native.LeanCall``) whose result needs Python: the plan's
    write-back (which checks rule J31), with the inputs strict hands back made ``jax.jit``'s
    arrays."""
    _, _, _, leaves, objects, *_ = call
    return info.plan.apply(as_jit_outputs(leaves, info.returned_inputs), objects, outputs)


class Inner(Runner):
    """The function the inner ``jax.jit`` traces under a policy: it rebuilds the arguments from
    the call's distinct leaves, runs ``fun`` on them (the lift's ``begin``, then ``_effects``'s
    steps) and returns the outputs boxed with what the trace recorded.

    It is called as ``jitted(key, donated, *kept)``: ``key``, static, is the call's
    ``(structure, static arguments, donation, static leaves, placements)``; ``donated`` the
    donated leaves (a list, donated as a whole, or None); ``kept`` the others, each its own
    argument, the shape JAX's C++ dispatch handles fastest (a box of them, a pytree node of its
    own, cost a microsecond or two more a call).

    To jax it looks like ``fun``: its name, its ``repr``, and (``__fun_debug_info__``) the
    source of ``fun`` and the names of the call's arguments, so that jax's messages (a
    non-array argument, a traced value used as a Python bool, an output that is not a JAX
    type) name the user's function, argument and key path as they do under ``jax.jit``.
    It is the lift's :class:`~treeclone._lift.Runner` whose current call is the native
    running call (:meth:`current_call`), and which holds ``fun`` weakly when it is shared.
    """

    traced_for = "jit"

    def __init__(
        self,
        fun: Callable,
        policy: Policy | ArgPolicies,
        kwargs: dict,
        naming: Naming,
        weak: bool,
        traced: Callable[[Any], bool] | None = None,
        keep_shardings: bool = True,
    ) -> None:
        self._weak = weak  # how ``fun`` is held (below), before the runner keeps it
        super().__init__(fun, policy, naming, traced)
        self.__name__ = fun_name(fun)
        self.__qualname__ = getattr(fun, "__qualname__", self.__name__)
        self.placement = Placement(
            kwargs.get("in_shardings"), kwargs.get("out_shardings"), keep_shardings
        )
        self.retraces = _retrace.History(fun, policy, naming.name)
        # The native call's key of each argument structure (with the order of its leaves:
        # ``CallShape.lean_key``), one object per structure: JAX compares a cached key with the
        # call's by identity first.
        self.keys: dict[Any, tuple] = {}

    @property
    def fun(self) -> Callable[..., Any]:
        """The user's function."""
        return self._held()

    @fun.setter
    def fun(self, fun: Callable[..., Any]) -> None:
        # Held weakly when shared between wrappers (the registry must not keep fun alive);
        # every caller holds fun itself.
        self._held: Callable[[], Any] = weakref.ref(fun) if self._weak else (lambda: fun)

    def current_call(self) -> JitCall | None:
        """The call of this function running now in this thread (None when traced ahead of
        time, or when the call running is another function's): the native running call."""
        call = _native.running_call()
        if type(call) is tuple:  # the lean path's, made into a JitCall when a trace needs it
            if call[0] is not self:
                return None
            call = lean_call_record(call)
            _native.swap_running_call(call)
        return call if call is not None and call.inner is self else None

    def input_names(self) -> list[str] | None:
        """The names of the inner jit's inputs, in its order ``(key, donated, *kept)``, for the
        call now running (None: jax's own)."""
        call = self.current_call()
        if call is None:
            return None
        kept, donated = jit_order(call.slot_names(self.naming), *call.key[2:4])
        return (donated or []) + kept

    def __repr__(self) -> str:
        return repr(self.fun)

    def __call__(self, key: tuple, donated: list | None, *kept: Any) -> ResultBox:
        sdef, statics, donation, static, placed = key
        call = self.current_call()  # None when traced ahead of time
        self.placement.check(None if call is None else call.leaves, placed)
        keep = None if donation is None else donation.keep
        leaves = from_jit_order(kept, donated, keep, static)
        num_args = len(sdef.children_of(sdef.num_nodes - 1)) - 1
        skip = frozenset() if static is None else static.slots
        leaves, given, misplaced = self.placement.inputs(
            sdef, leaves, num_args, placed, self._slot_names, self._argument_name, skip
        )
        static_args = None
        if statics is not None:
            total, static_pos, static_kw = statics
            static_args = (total, {i: v for i, _, v in static_pos}, {k: v for k, _, v in static_kw})
        prepared = begin(
            self.fun,
            self.policy,
            self.naming,
            sdef,
            leaves,
            static_args,
            caller_objects=None if call is None else call.objects,
        )
        policy, positions = prepared.req.policy, prepared.req.layout.positions
        names_now = [self.naming.name(i) for i in positions]
        # Where each input leaf was, when an array written back may keep its placement.
        actual = None if call is None else shardings(call.leaves)
        kept_at = self.placement.kept(placed, given, actual)
        before = self._argument_leaves(prepared, names_now) if kept_at else []
        called = prepared.call()
        by_leaf = self.placement.outputs(called.out)
        keep_inputs = self._keep_inputs(leaves, keep, static, called.out, by_leaf)
        diffed = called.diff()
        planned = diffed.plan(keep_inputs=keep_inputs)
        plan, outputs = planned.plan, planned.outputs
        # Why this trace happened, in the user's words (trace time only: _retrace).
        self.retraces.traced(key, leaves, prepared.req.layout, (prepared.args, prepared.kwargs))
        info = self._jit_record(plan, outputs, diffed)
        info.next_inputs = diffed.next_inputs(planned)
        info.hold_inputs = (
            call is not None
            and platform(call.leaves) in HOLD_INPUT_PLATFORMS
            and traced_bytes(leaves) <= HOLD_INPUT_BYTES
        )
        if policy.mutations != "propagate":
            info.returned_inputs = returned_inputs(leaves, called.out, keep_inputs, static)
        if self.traced is not None:
            outputs = self._static_outputs(info, outputs)
        pinned: dict[int, Any] = {}
        if kept_at:
            after = self._argument_leaves(prepared, names_now)
            slot_of = {id(x): s for s, x in enumerate(leaves)}
            pinned = pins(before, after, slot_of, kept_at, outputs)
        static_outputs = {i for i, _ in info.static_outputs}
        outputs = place_outputs(outputs, by_leaf, pinned, static_outputs.__contains__)
        if misplaced is not None:  # jax.jit checks the arguments' placement after its trace
            raise ValueError(misplaced)
        return ResultBox(info, outputs)

    def _slot_names(self) -> list[str]:
        """Each input leaf's key path, as jax.jit names it, for an error about it."""
        call = self.current_call()
        return [] if call is None else call.slot_names(self.naming)

    def _argument_name(self, i: int) -> str:
        """The name of the call's ``i``-th (dynamic) positional argument, as jax.jit names it
        (the signature's, for a call traced ahead of time)."""
        call = self.current_call()
        names = [] if call is None else [name for name, _ in call.named_arguments(self.naming)]
        return names[i] if i < len(names) else self.naming.name(i)

    def _argument_leaves(self, prepared: Any, names: list[str]) -> list[tuple[str, Any]]:
        """The leaves of the arguments whose policy writes back or checks, by key path."""
        req = prepared.req
        return argument_leaves(prepared.args, prepared.kwargs, names, req.policy, req.arg_policies)

    def _static_outputs(self, info: JitRecord, outputs: list) -> list:
        """What the function made that the ``traced=`` rule leaves static (a new string, a
        function, a Python number) is not an output of the computation: it comes back as it
        is, as from equinox's filter_jit (recorded in ``info``); a traced value always is
        one."""
        traced = self.traced
        assert traced is not None
        info.static_outputs = tuple(
            (i, x) for i, x in enumerate(outputs) if not isinstance(x, Tracer) and not traced(x)
        )
        if info.static_outputs:
            outputs = list(outputs)
            for i, _ in info.static_outputs:
                outputs[i] = None
        return outputs

    def _keep_inputs(
        self, leaves: list, keep: Sequence[bool] | None, static: Any, out: Any, by_leaf: dict
    ) -> list[bool] | None:
        """Per input leaf, whether it may be handed back to the caller as it came in (None:
        every one may). Not when it was donated (jax deletes it), resharded by in_shardings
        or placed by out_shardings (``by_leaf``) and the function returns it: then the
        computation outputs it (and a returned input container gets it, placed as asked). A
        donated leaf the function does not return is not an output, so that XLA can reuse its
        buffer (and warns, as under jax.jit, when none of the outputs can use it); the
        caller's containers keep the donated array, which jax deletes, as under jax.jit."""
        consumed: set[int] = set()
        if self.placement.in_shardings is not None:
            consumed.update(range(len(leaves)))
        elif keep is not None:  # donated (a static leaf is not an input of the computation)
            consumed.update(
                s for s, k in enumerate(keep) if not k and not is_static_slot(static, s)
            )
        if by_leaf:
            consumed.update(
                s
                for s, x in enumerate(leaves)
                if id(x) in by_leaf and not is_static_slot(static, s)
            )
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

    def _jit_record(self, plan: Any, outputs: list, diffed: _effects.Diffed) -> JitRecord:
        """The trace's ``JitRecord``: where each output is, and how ``fun``'s result is made."""
        paths = [""] * len(outputs)
        out_tree, out_sources = None, None
        prepared = diffed.prepared
        leaves = prepared.req.leaves
        try:
            where: dict[int, str] = {}
            out_leaves, out_tree = jax.tree_util.tree_flatten_with_path(diffed.out)
            for path, leaf in out_leaves:
                where.setdefault(id(leaf), jit_keystr(path))
            args, kwargs = prepared.args, prepared.kwargs
            positions = prepared.req.layout.positions
            arg_names = [self.naming.name(i) for i in positions] + [str(k) for k in kwargs]
            for name, value in zip(arg_names, [*args, *kwargs.values()], strict=True):
                for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                    where.setdefault(id(leaf), name + jit_keystr(path))
            paths = [where.get(id(x), "") for x in outputs]
            index = {id(x): ("in", s) for s, x in enumerate(leaves)}
            index.update({id(x): ("out", i) for i, x in reversed(list(enumerate(outputs)))})
            out_sources = tuple(index[id(leaf)] for _, leaf in out_leaves)
        except Exception:  # noqa: BLE001 - descriptions only; the plan is what matters
            out_sources = None
        return JitRecord(plan, tuple(paths), out_tree, out_sources)


def returned_inputs(
    leaves: list, out: Any, keep_inputs: Sequence[bool] | None, static: Any
) -> tuple[int, ...]:
    """Under a policy that gives ``jax.jit``'s results (strict), the input slots the result
    ``out`` hands back as they came in, each returned as a ``jax.Array`` (rule J15); alias
    gives plain Python's, the caller's own object. treeclone's own flatten: JAX's recurses
    natively and fails on a deep result (the trace has flattened this one already)."""
    returned = {id(x) for x in _native.leaves(out)}
    return tuple(
        s
        for s, x in enumerate(leaves)
        if id(x) in returned
        and (keep_inputs is None or keep_inputs[s])
        and not is_static_slot(static, s)  # handed back as it is, as equinox does
    )


def platform(values: Sequence[Any]) -> str:
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


def traced_bytes(leaves: list) -> int:
    """The bytes of the arrays a trace's input ``leaves`` stand for (its tracers' shapes and
    dtypes; a dtype without an item size, such as a PRNG key's, counts as 8 bytes an item)."""
    total = 0
    for x in leaves:
        if isinstance(x, Tracer):
            aval = x.aval
            itemsize = getattr(getattr(aval, "dtype", None), "itemsize", 8)
            total += getattr(aval, "size", 1) * itemsize
    return total


def make_inner(
    fun: Callable,
    policy: Policy | ArgPolicies,
    kwargs: dict[str, Any],
    naming: Naming,
    weak: bool,
    traced: Callable[[Any], bool] | None = None,
    keep_shardings: bool = True,
) -> tuple[Inner, Any]:
    """The ``jax.jit`` that runs ``fun`` under ``policy`` on a call's distinct leaves, as
    ``jitted(key, donated, *kept)`` (see :class:`Inner`); ``traced``: the rule that leaves
    the other leaves static (``jit(traced=...)``); ``keep_shardings``: whether arrays written
    back keep the placement of those they replace (``_jit.placement``)."""
    inner = Inner(fun, policy, kwargs, naming, weak, traced, keep_shardings)
    options = {k: v for k, v in kwargs.items() if k not in ARG_OPTIONS + SHARDINGS}
    options["static_argnums"] = (0,)
    if kwargs.get("donate_argnums") is not None or kwargs.get("donate_argnames") is not None:
        options["donate_argnums"] = (1,)
    with warnings.catch_warnings():
        # jax.jit already warned about deprecated options when the user's function was wrapped.
        warnings.simplefilter("ignore", DeprecationWarning)
        return inner, jax.jit(inner, **options)


def fun_name(fun: Callable) -> str:
    """The name jax.jit gives ``fun`` (its compiled module is ``jit_<name>``)."""
    while isinstance(fun, functools.partial) and getattr(fun, "__name__", None) is None:
        fun = fun.func
    return getattr(fun, "__name__", "<unnamed function>")
