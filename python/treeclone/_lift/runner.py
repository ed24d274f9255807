"""The user's function run at trace time under a policy: :func:`begin` starts every
transformation's trace (``_effects``'s steps follow), :class:`Runner` is what a JAX
transformation is handed, and :func:`reporting` is the function ``clone`` hands it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jax.core import Tracer

from treeclone import _effects
from treeclone._jax_compat import DebugInfo, fun_sourceinfo
from treeclone._lift.arguments import StaticLeaves, Statics
from treeclone._lift.boxes import StaticOut
from treeclone._lift.naming import Naming, debug_info
from treeclone.policies import ArgPolicies, Policy, for_call, policy_override


def current_policy(default: Policy | ArgPolicies) -> Policy | ArgPolicies:
    """The policy a call runs under: the innermost ``with treeclone.policy(...)`` block's, else
    the function's own (``default``; a block's policy wins over a dict, as for jit).

    >>> import treeclone
    >>> from treeclone._lift import current_policy
    >>> with treeclone.policy("strict"):
    ...     current_policy(treeclone.ALIAS)
    Policy.strict
    """
    return policy_override.get() or default


def reporting(
    fun: Any,
    static_nums: frozenset[int] = frozenset(),
    static_names: frozenset[str] = frozenset(),
    mode: str | None = None,
) -> Any:
    """``fun`` as the clone policy hands it to a JAX transformation: reporting, each time it is
    traced, the changes it makes in place and does not return (``_effects.ReportingDiscards``;
    the same object for the same function and options, so JAX's caches find it again).

    >>> import jax, jax.numpy as jnp, warnings
    >>> from treeclone._lift import reporting
    >>> def bump(d):
    ...     d["n"] = d["n"] + 1
    >>> reporting(bump) is reporting(bump), reporting(bump).__wrapped__ is bump
    (True, True)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     jax.jit(reporting(bump))({"n": jnp.zeros(())})
    >>> caught[0].category.__name__
    'MutationWarning'
    """
    return _effects.reporting_discards(
        fun, lambda f: Naming(f).name, frozenset(static_nums), frozenset(static_names), mode
    )


class Runner:
    """``fun`` under a policy, run on a call's rebuilt arguments at trace time.

    Per thread, for the call being traced (set with :meth:`calling`): ``objects``, the
    caller's object at each node, watched while the function runs (``_effects.Request``'s
    ``caller_objects``), ``names``, where each input of the traced function is in the
    call, which jax's messages (a traced value used as a bool, ...) print through
    ``__fun_debug_info__`` with ``fun``'s source, as they do for ``fun`` itself, and
    ``call``, what the transformation itself needs of the call (vmap's axes, a loop's call)
    while JAX runs the runner.
    A runner whose call is kept elsewhere (jit's, the native running call) says so in
    :meth:`current_call` and :meth:`input_names`.
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

    def calling(
        self, objects: list | None, names: Iterable[str] | None = None, call: Any = None
    ) -> _Calling:
        """A context in which this thread's traces watch ``objects``, name the traced
        function's inputs ``names`` and find the transformation's ``call``: the one current
        call of the runner in this thread.

        >>> from treeclone import ALIAS
        >>> from treeclone._lift import Naming, Runner
        >>> runner = Runner(print, ALIAS, Naming(print))
        >>> with runner.calling([], ["x"], call="vmap's axes"):
        ...     runner.local.names, runner.local.call
        (['x'], "vmap's axes")
        """
        return _Calling(self.local, objects, names, call)

    def current_call(self) -> Any:
        """What the transformation needs of the call being traced in this thread (the ``call``
        of :meth:`calling`; None outside one).

        >>> from treeclone import ALIAS
        >>> from treeclone._lift import Naming, Runner
        >>> runner = Runner(print, ALIAS, Naming(print))
        >>> with runner.calling([], call="vmap's axes"):
        ...     runner.current_call()
        "vmap's axes"
        """
        return getattr(self.local, "call", None)

    def input_names(self) -> Iterable[str] | None:
        """The names jax's messages give the traced function's inputs in this thread's call
        (the ``names`` of :meth:`calling`; None: jax's own).

        >>> from treeclone import ALIAS
        >>> from treeclone._lift import Naming, Runner
        >>> runner = Runner(print, ALIAS, Naming(print))
        >>> with runner.calling([], ["params['w']"]):
        ...     runner.input_names()
        ["params['w']"]
        >>> runner.input_names() is None
        True
        """
        return getattr(self.local, "names", None)

    @property
    def __fun_debug_info__(self) -> Any:
        """How jax's messages (a traced value used as a bool, ...) name the function and its
        inputs: ``fun``'s source, :meth:`input_names`; best effort, never failing a call."""
        if DebugInfo is None:
            return None
        try:
            names = self.input_names()
        except Exception:  # noqa: BLE001 - naming is best effort; never fail a call over it
            return None
        return debug_info(self.traced_for, self.sourceinfo, names)

    def begin(
        self,
        sdef: Any,
        leaves: list,
        statics: Statics | None = None,
        static: StaticLeaves | None = None,
    ) -> _effects.Prepared:
        """Start a trace of ``fun`` on the arguments rebuilt from ``leaves`` (see :func:`begin`),
        with the leaves ``traced=`` left static (``static``) put back in their slots; the caller
        takes the next steps (``.call()``, ``.diff()``, ``.plan()``) and hands the plan to
        :meth:`outputs`.

        >>> from treeclone import ALIAS
        >>> from treeclone._lift import Naming, Runner, flatten_call
        >>> call = flatten_call(Naming(max), ([3, 1], "key"), {})
        >>> Runner(max, ALIAS, Naming(max)).begin(call.sdef, call.leaves).args
        ([3, 1], 'key')
        """
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

    def outputs(self, plan: _effects.Plan) -> list:
        """The outputs of a trace's plan, those its ``traced=`` rule leaves static given as
        :class:`StaticOut`.

        >>> import numpy as np
        >>> from treeclone import ALIAS
        >>> from treeclone._lift import Naming, Runner, flatten_call, is_array
        >>> def scale(x):
        ...     return x * 2, "scaled"
        >>> runner = Runner(scale, ALIAS, Naming(scale), traced=is_array)  # arrays are traced
        >>> call = flatten_call(runner.naming, (np.ones(2),), {})
        >>> plan = runner.begin(call.sdef, call.leaves).call().diff().plan()
        >>> [type(x).__name__ for x in runner.outputs(plan)]
        ['ndarray', 'StaticOut']
        """
        rule = self.traced
        if rule is None:
            return plan.outputs
        return [x if isinstance(x, Tracer) or rule(x) else StaticOut(x) for x in plan.outputs]


def with_static(leaves: Sequence[Any], static: StaticLeaves | None) -> list:
    """The leaves a JAX transformation handed in (:meth:`Call.traced_leaves`), with the
    static ones (``static``) back in their slots.

    >>> import numpy as np
    >>> from treeclone._lift import Naming, flatten_call, is_array, with_static
    >>> call = flatten_call(Naming(print), (np.ones(2), "relu"), {}, traced=is_array)
    >>> with_static(call.traced_leaves(), call.static)
    [array([1., 1.]), 'relu']
    """
    leaves = list(leaves)
    if static is not None:
        for s, _, value in static.entries:
            leaves[s] = value
    return leaves


class _Calling:
    __slots__ = ("call", "local", "names", "objects", "saved")

    def __init__(self, local: threading.local, objects: list | None, names: Any, call: Any):
        self.local, self.objects, self.names, self.call = local, objects, names, call
        self.saved: tuple = (None, None, None)

    def __enter__(self) -> None:
        local = self.local
        self.saved = (
            getattr(local, "objects", None),
            getattr(local, "names", None),
            getattr(local, "call", None),
        )
        local.objects, local.names, local.call = self.objects, self.names, self.call

    def __exit__(self, *exc: object) -> None:
        self.local.objects, self.local.names, self.local.call = self.saved


def begin(
    fun: Callable[..., Any],
    policy: Policy | ArgPolicies,
    naming: Naming,
    sdef: Any,
    leaves: list,
    static_args: _effects.StaticArgs | None,
    *,
    caller_objects: Sequence[Any] | None = None,
    eager: bool = False,
) -> _effects.Prepared:
    """Start a trace: rebuild a call from ``leaves`` (structure ``sdef``, static arguments
    ``static_args``) to run ``fun`` on it under ``policy`` (``_effects``'s first step). A policy per
    argument is resolved for this call's arguments (``policies.for_call``): each argument's
    containers follow their own policy. ``caller_objects``: the caller's object at each node,
    watched while ``fun`` runs. ``eager``: ``fun`` runs in the caller's own JAX trace
    (``treeclone.call``), not in one a JAX transformation made for it. Every transformation's
    trace starts here; the next steps are
    ``_effects``'s (``Prepared.call``, ``Called.diff``, ``Diffed.plan``), and the plan's
    ``plan.apply(caller_leaves, caller_objects, outputs)`` gives the call's result.

    >>> from treeclone import STRICT
    >>> from treeclone._lift import Naming, begin, flatten_call
    >>> def scale(x, factor):
    ...     return x * factor
    >>> call = flatten_call(Naming(scale), (2.0,), {}, static_nums=())
    >>> prepared = begin(scale, STRICT, Naming(scale), call.sdef, call.leaves, (2, {1: 3.0}, {}))
    >>> prepared.req.layout.names, prepared.call().out
    (('x',), 6.0)
    """
    root = sdef.num_nodes - 1
    num_args = len(sdef.children_of(root)) - 1
    if static_args is None:
        positions = list(range(num_args))
    else:
        positions = [i for i in range(static_args[0]) if i not in static_args[1]]
    kwargs_node = sdef.children_of(root)[-1]
    keywords = list(sdef.node_info()[kwargs_node].data or ())
    chosen, arg_policies = for_call(policy, positions, keywords)
    named = None
    if arg_policies is not None and isinstance(policy, ArgPolicies):
        named = policy.named(positions, keywords)
    layout = _effects.Layout(num_args, [naming.name(i) for i in positions], positions)
    request = _effects.Request(
        fun,
        sdef,
        leaves,
        layout,
        chosen,
        arg_policies=arg_policies,
        arg_named=named,
        caller_objects=caller_objects,
        static_args=static_args,
        eager=eager,
    )
    return _effects.prepare(request)
