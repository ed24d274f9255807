"""The lift every policy-aware transformation other than ``jit`` shares.

A transformation under a policy other than ``clone`` does three things, each done here once:

1. **flatten the call** (:func:`flatten_call`): the arguments, with identity (the same array
   passed twice is one input, a shared container one object), static arguments taken out and
   kept, hashed, as part of the call's structure; a cycle is the ``ValueError`` of every
   policy, naming the argument;
2. **run the function at trace time** (:func:`begin`, then ``_trace``'s steps): rebuild the
   arguments from the leaves the JAX transformation hands in (tracers), run the user's
   function on them and record what it did as a native ``CallPlan``. The plan leaves the
   transformed function as the static data of an :class:`Out` node, so it is found in JAX's
   output structure even when JAX reuses a cached trace, and the computation's outputs are
   its leaves;
3. **apply the plan** to the concrete outputs (``out.record.plan.apply(leaves, objects,
   out.leaves)``): it rebuilds the result and, under ``alias``, writes the mutations into the
   caller's objects, all or nothing.

The leaves may be tracers of an outer transformation: the lift works the same inside ``jit``,
``grad`` or another lift, and its write-back then lands in the outer trace's rebuilt objects,
where the outer lift sees it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import jax
from jax.core import Tracer

from treeclone import _native, _trace
from treeclone._calls import Naming, StaticLeaves, check_arguments, check_cycles, jit_keystr
from treeclone._jax_compat import INITIAL_RESULT_PATHS, DebugInfo, fun_sourceinfo
from treeclone.policies import ArgPolicies, Policy, for_call

__all__ = [
    "Call",
    "Out",
    "Record",
    "Runner",
    "Static",
    "StaticOut",
    "Wrapper",
    "begin",
    "check_call",
    "flatten_call",
    "with_static",
]


class Static:
    """A static argument's value in a call's key: equal by value when hashable, else by
    identity (as ``jax.checkpoint`` keys its static arguments)."""

    __slots__ = ("hash", "hashable", "value")

    def __init__(self, value: Any):
        self.value = value
        try:
            self.hash, self.hashable = hash((type(value), value)), True
        except TypeError:
            self.hash, self.hashable = id(value), False

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Static):
            return False
        if self.hashable and other.hashable:
            return type(self.value) is type(other.value) and bool(self.value == other.value)
        return self.value is other.value


# (number of positional arguments, ((position, Static), ...), ((keyword, Static), ...)).
Statics = tuple[int, tuple[tuple[int, Static], ...], tuple[tuple[str, Static], ...]]


class Call:
    """One call, flattened with identity: its distinct ``leaves``, their structure ``sdef``
    (with sharing), the caller's object at each node (``objects``), the dynamic ``args`` and
    ``kwargs`` that were flattened, the static arguments (``statics``, None without) and the
    leaves a ``traced=`` rule leaves static (``static``, None without)."""

    __slots__ = ("args", "kwargs", "leaves", "objects", "sdef", "static", "statics")

    def __init__(
        self,
        leaves: list,
        sdef: Any,
        objects: list,
        args: tuple,
        kwargs: dict,
        statics: Statics | None,
        static: StaticLeaves | None = None,
    ):
        self.leaves, self.sdef, self.objects = leaves, sdef, objects
        self.args, self.kwargs, self.statics, self.static = args, kwargs, statics, static

    def traced_leaves(self) -> list:
        """The leaves a JAX transformation is given: each static one (``traced=``) is None,
        an empty pytree that JAX passes through, and :func:`trace` puts it back."""
        if self.static is None:
            return self.leaves
        slots = self.static.slots
        return [None if s in slots else x for s, x in enumerate(self.leaves)]

    def arg_slots(self) -> list[list[int]]:
        """The distinct leaves (slots) reachable from each dynamic positional argument."""
        return self.sdef.child_slots(self.sdef.num_nodes - 1)[: len(self.args)]

    def slot_names(self, naming: Naming) -> list[str]:
        """For each distinct leaf, where it is in the call (the first place), as jax's
        messages name an argument: ``params['w']``."""
        found: dict[int, list[str]] = {}
        named = [(naming.name(i), a) for i, a in enumerate(self.args)]
        named += [(str(k), v) for k, v in self.kwargs.items()]
        for name, value in named:
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                found.setdefault(id(leaf), []).append(name + jit_keystr(path))
        # A Python scalar is a value: one object may be several leaves; name them in turn.
        seen: dict[int, int] = {}
        names = []
        for leaf in self.leaves:
            places = found.get(id(leaf), [""])
            k = seen[id(leaf)] = seen.get(id(leaf), -1) + 1
            names.append(places[min(k, len(places) - 1)])
        return names

    def input_names(self, naming: Naming) -> list[str] | None:
        """The names of the inputs a JAX transformation sees (:meth:`traced_leaves`: the
        static ones left out), for jax's messages; None where jax names nothing."""
        if DebugInfo is None:
            return None
        names = self.slot_names(naming)
        if self.static is None:
            return names
        return [n for s, n in enumerate(names) if s not in self.static.slots]

    def slot_path(self, naming: Naming, slot: int) -> str:
        """Where leaf ``slot`` is in the call, as messages name it (``params['w']``)."""
        target = self.leaves[slot]
        named = [(naming.name(i), a) for i, a in enumerate(self.args)]
        named += [(str(k), v) for k, v in self.kwargs.items()]
        for name, value in named:
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                if leaf is target:
                    return name + jit_keystr(path)
        return f"<leaf {slot}>"


# Raise the ``ValueError`` every policy raises for a cyclic argument, naming it, before a JAX
# transformation's own flatten meets the cycle (docs/semantics.md, rule 14): one native look
# through the arguments it flattens (static positions and keywords, frozensets, left out).
# Under ``clone`` this is all a call adds. The same check as ``jit``'s clone path.
check_call = check_arguments


def flatten_call(
    naming: Naming,
    args: tuple,
    kwargs: dict,
    static_nums: Iterable[int] = (),
    static_names: Iterable[str] = (),
    traced: Callable[[Any], bool] | None = None,
) -> Call:
    """Flatten a call's dynamic arguments with identity (see the module docstring).

    ``static_nums`` (negative ones count from the end) and ``static_names`` are taken out and
    put in ``Call.statics``, to be part of the traced structure's key. ``traced`` (a rule of
    ``traced=``, resolved) leaves the leaves it rejects static: ``Call.static``, hashed as
    jit hashes them (an unhashable one is a TypeError naming its key path)."""
    nums = frozenset(i + len(args) if i < 0 else i for i in static_nums)
    names = frozenset(static_names)
    statics: Statics | None = None
    given = args, kwargs
    if nums or names:
        statics = (
            len(args),
            tuple((i, Static(args[i])) for i in sorted(nums) if 0 <= i < len(args)),
            tuple(sorted((k, Static(v)) for k, v in kwargs.items() if k in names)),
        )
        args = tuple(a for i, a in enumerate(args) if i not in nums)
        kwargs = {k: v for k, v in kwargs.items() if k not in names}
    if len(kwargs) > 1:  # keyword order is not part of a call's structure, as in jax.jit
        kwargs = dict(sorted(kwargs.items()))
    try:
        leaves, sdef, objects = _native.flatten_shared((*args, kwargs))
    except ValueError:
        check_cycles(naming, *given, nums, names)  # the text of every policy, naming the argument
        raise
    static = None if traced is None else StaticLeaves.of(leaves, traced, args, kwargs, naming)
    return Call(leaves, sdef, objects, args, kwargs, statics, static)


class Wrapper:
    """What every lifted transformation's wrapper shares: it binds as a method, as the function
    it wraps does, and its repr names the transformation (``name``), the function and the
    policy."""

    name = "transformation"
    _fun: Callable[..., Any]
    _policy: Policy | ArgPolicies

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(cast(Callable[..., Any], self), obj)  # subclasses are callable

    def __repr__(self) -> str:
        return f"<treeclone.{self.name} of {self._fun!r} (policy {self._policy!r})>"


class Record:
    """What one trace recorded: the ``CallPlan``, what the transformation adds (``extra``,
    such as where the gradients go) and, under a ``traced=`` rule, the outputs the rule left
    static (``static_outputs``: position and value). The static data of an :class:`Out`,
    compared by identity, so that each of JAX's cached traces keeps its own."""

    __slots__ = ("extra", "plan", "static_outputs")

    def __init__(self, plan: Any, extra: Any = None):
        self.plan, self.extra = plan, extra
        self.static_outputs: tuple[tuple[int, Any], ...] = ()


class StaticOut:
    """An output of a traced function that its ``traced=`` rule leaves static (a function, a
    string, a Python number): :class:`Out` keeps it in its record, out of JAX's sight."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class Out:
    """The outputs of a lifted function, with its :class:`Record` as static data. Outputs
    given as :class:`StaticOut` are kept in the record: JAX sees None (an empty pytree) in
    their place, and every ``Out`` rebuilt from JAX's leaves has them back."""

    __slots__ = ("leaves", "record")

    def __init__(self, record: Record, leaves: Sequence[Any]):
        self.record, self.leaves = record, list(leaves)
        static = tuple((i, x.value) for i, x in enumerate(self.leaves) if type(x) is StaticOut)
        if static:
            record.static_outputs = static
            for i, value in static:
                self.leaves[i] = value


def _flatten_out(out: Out) -> tuple[list, Record]:
    static = () if out.record is None else out.record.static_outputs
    if not static:
        return out.leaves, out.record
    leaves = list(out.leaves)
    for i, _ in static:
        leaves[i] = None
    return leaves, out.record


def _unflatten_out(record: Record, leaves: Sequence[Any]) -> Out:
    out = object.__new__(Out)
    out.record, out.leaves = record, list(leaves)
    if record is not None:
        for i, value in record.static_outputs:
            out.leaves[i] = value
    return out


jax.tree_util.register_pytree_node(Out, _flatten_out, _unflatten_out)
_native.invalidate_registry_cache()


class Runner:
    """``fun`` under a policy, run on a call's rebuilt arguments at trace time.

    Per thread, for the call being traced (set with :meth:`calling`): ``objects``, the
    caller's object at each node, watched while the function runs (``_trace.run``'s
    ``caller_objects``), and ``names``, where each input of the traced function is in the
    call, which jax's messages (a traced value used as a bool, ...) print through
    ``__fun_debug_info__`` with ``fun``'s source, as they do for ``fun`` itself.
    ``traced_for``: what jax's messages say the function is traced for. ``policy`` may give
    a policy per argument (:class:`~treeclone.policies.ArgPolicies`): each trace resolves it
    for the arguments it is given (:func:`trace`). ``traced``: the ``traced=`` rule (resolved;
    None: every leaf is traced), which also leaves static what the function returns that it
    rejects (:class:`StaticOut`)."""

    traced_for = "transformation"

    def __init__(
        self,
        fun: Callable[..., Any],
        policy: Policy | ArgPolicies,
        naming: Naming,
        traced: Callable[[Any], bool] | None = None,
    ):
        self.fun, self.policy, self.naming, self.traced = fun, policy, naming, traced
        self.local = threading.local()
        self.__name__ = getattr(fun, "__name__", type(self).__name__)
        self.sourceinfo: Any = None
        if DebugInfo is not None:
            try:
                self.sourceinfo = fun_sourceinfo(fun)
            except Exception:  # noqa: BLE001 - naming is best effort
                pass

    def calling(self, objects: list | None, names: Sequence[str] | None = None) -> _Calling:
        """A context in which this thread's traces watch ``objects`` and name the traced
        function's inputs ``names``."""
        return _Calling(self.local, objects, names)

    @property
    def __fun_debug_info__(self) -> Any:
        names = getattr(self.local, "names", None)
        if names is None or DebugInfo is None:
            return None
        try:
            return DebugInfo(self.traced_for, self.sourceinfo, tuple(names), INITIAL_RESULT_PATHS)
        except Exception:  # noqa: BLE001 - naming is best effort; never fail a call over it
            return None

    def begin(
        self,
        sdef: Any,
        leaves: list,
        statics: Statics | None = None,
        static: StaticLeaves | None = None,
    ) -> _trace.Prepared:
        """Start a trace of ``fun`` on the arguments rebuilt from ``leaves`` (see :func:`begin`),
        with the leaves ``traced=`` left static (``static``) put back in their slots; the caller
        takes the next steps (``.call()``, ``.diff()``, ``.plan()``) and hands the plan to
        :meth:`outputs`."""
        static_args = None
        if statics is not None:
            total, static_pos, static_kw = statics
            static_args = (
                total,
                {i: s.value for i, s in static_pos},
                {k: s.value for k, s in static_kw},
            )
        return begin(
            self.fun,
            self.policy,
            self.naming,
            sdef,
            with_static(leaves, static),
            static_args,
            caller_objects=getattr(self.local, "objects", None),
        )

    def outputs(self, plan: _trace.Plan) -> list:
        """The outputs of a trace's plan, those its ``traced=`` rule leaves static given as
        :class:`StaticOut`."""
        rule = self.traced
        if rule is None:
            return plan.outputs
        return [x if isinstance(x, Tracer) or rule(x) else StaticOut(x) for x in plan.outputs]

    def trace(
        self,
        sdef: Any,
        leaves: list,
        statics: Statics | None = None,
        static: StaticLeaves | None = None,
    ) -> tuple[Any, list]:
        """The whole trace, for a transformation that needs nothing between its steps:
        ``(plan, outputs)``."""
        plan = self.begin(sdef, leaves, statics, static).call().diff().plan()
        return plan.plan, self.outputs(plan)


def with_static(leaves: Sequence[Any], static: StaticLeaves | None) -> list:
    """The leaves a JAX transformation handed in (:meth:`Call.traced_leaves`), with the
    static ones (``static``) back in their slots."""
    leaves = list(leaves)
    if static is not None:
        for s, _, value in static.entries:
            leaves[s] = value
    return leaves


class _Calling:
    __slots__ = ("local", "names", "objects", "saved")

    def __init__(self, local: threading.local, objects: list | None, names: Any):
        self.local, self.objects, self.names = local, objects, names
        self.saved: tuple = (None, None)

    def __enter__(self) -> None:
        self.saved = (getattr(self.local, "objects", None), getattr(self.local, "names", None))
        self.local.objects, self.local.names = self.objects, self.names

    def __exit__(self, *exc: object) -> None:
        self.local.objects, self.local.names = self.saved


def begin(
    fun: Callable[..., Any],
    policy: Policy | ArgPolicies,
    naming: Naming,
    sdef: Any,
    leaves: list,
    static_args: _trace.StaticArgs | None,
    *,
    caller_objects: Sequence[Any] | None = None,
) -> _trace.Prepared:
    """Start a trace: rebuild a call from ``leaves`` (structure ``sdef``, static arguments
    ``static_args``) to run ``fun`` on it under ``policy`` (``_trace``'s first step). A policy per
    argument is resolved for this call's arguments (``policies.for_call``): each argument's
    containers follow their own policy. ``caller_objects``: the caller's object at each node,
    watched while ``fun`` runs. Every transformation's trace starts here; the next steps are
    ``_trace``'s (``Prepared.call``, ``Called.diff``, ``Traced.plan``), and the plan's
    ``plan.apply(caller_leaves, caller_objects, outputs)`` gives the call's result."""
    root = sdef.num_nodes - 1
    num_args = len(sdef.children_of(root)) - 1
    if static_args is None:
        positions = list(range(num_args))
    else:
        positions = [i for i in range(static_args[0]) if i not in static_args[1]]
    kwargs_node = sdef.children_of(root)[-1]
    keywords = list(sdef.node_info()[kwargs_node].data or ())
    chosen, arg_policies = for_call(policy, positions, keywords)
    layout = _trace.Layout(num_args, [naming.name(i) for i in positions], positions)
    request = _trace.Request(
        fun,
        sdef,
        leaves,
        layout,
        chosen,
        arg_policies=arg_policies,
        caller_objects=caller_objects,
        static_args=static_args,
    )
    return _trace.prepare(request)
