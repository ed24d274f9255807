"""A trace, step by step: the user's function run on inputs rebuilt from leaves, and what it did.

Every transformation runs its function through these steps (the lift, ``treeclone._lift``,
starts them), reading what it needs from the record each step returns:

1. :func:`prepare` (a :class:`Request` -> :class:`Prepared`): the inputs rebuilt from the
   leaves, with what the later steps compare against (each container's policy, strict's
   watch of static objects, the caller's containers the function must not reach);
2. :meth:`Prepared.call` (-> :class:`Called`): the function runs on them; a transformation
   may check or change ``Called.out`` (``out_shardings``, ``has_aux``) before the next step;
3. :meth:`Called.diff` (-> :class:`Diffed`): what changed in each input container, strict's
   ``MutationError`` and clone's report, the result's structure with the ``Origin`` of each
   container written back (``_effects.writes``);
4. :meth:`Diffed.plan` (-> :class:`Plan`): the native ``CallPlan`` that rebuilds the result
   and writes back at every call, and the leaves the computation must output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import NoneType
from typing import Any

from jax.errors import UnexpectedTracerError

from treeclone import _native
from treeclone._docs import see
from treeclone._effects.consumed import take_successors
from treeclone._effects.diff import cyclic_part, describe_changes, flatten_after, returned_nodes
from treeclone._effects.enclosing import EnclosingWrites
from treeclone._effects.messages import (
    leaf_path,
    mutation_lines,
    per_argument_remedy,
    policy_name,
    qualname,
    raise_escaped,
    raise_mutation_error,
    raise_outside_attribute,
    raise_static_mutation,
    raise_traced_static_data,
    report_discarded,
    report_off,
)
from treeclone._effects.tree import (
    Layout,
    NodeInfo,
    unstable_static_data,
)
from treeclone._effects.watch import (
    check_callers,
    restore_static_state,
    running_on,
    static_changes,
    static_snapshot,
    watch_callers,
)
from treeclone._effects.writes import (
    HeldLeaves,
    Writes,
    container_writes,
    next_inputs,
    node_policies,
)
from treeclone._jax_compat import current_trace, first_escaped
from treeclone._native import Source
from treeclone._writeback import write_custom
from treeclone.policies import Policy

# (number of positional arguments, {position: value}, {keyword: value}): the static arguments
# a call took out before flattening, put back around the rebuilt dynamic ones.
StaticArgs = tuple[int, dict[int, Any], dict[str, Any]]


class Request:
    """One run of ``fun`` on the tree of ``sdef`` rebuilt from ``leaves``, the call's
    ``(*args, kwargs)`` laid out as ``layout`` says, under ``policy``.

    ``arg_policies``: the policy of each argument (the positional ones, then the keyword ones
    in the kwargs dict's order) of a call that mixes them; ``policy`` is then the call's as a
    whole (``policies.for_call``): each container follows its argument's.
    ``caller_objects``: the caller's object at each node of ``sdef``, watched while the
    function runs: one it changes through another name (a global that is also an argument)
    is put back and reported, since write-back would silently replace that change.
    ``static_args``: the static arguments to put back around the dynamic ones.
    ``arg_named``: per argument, whether a dict without ``...`` named it (None: every policy
    was chosen); a container of an argument it does not name that a named one also holds
    follows the named one (rule P5). ``eager``: the function runs in the caller's own JAX
    trace (``treeclone.call``), not in one a JAX transformation made for it (rule J31,
    ``_effects.enclosing``)."""

    __slots__ = (
        "arg_named",
        "arg_policies",
        "caller_objects",
        "eager",
        "fun",
        "layout",
        "leaves",
        "policy",
        "sdef",
        "static_args",
    )

    def __init__(
        self,
        fun: Callable[..., Any],
        sdef: Any,
        leaves: list,
        layout: Layout,
        policy: Policy,
        *,
        arg_policies: Sequence[Policy] | None = None,
        arg_named: Sequence[bool] | None = None,
        caller_objects: Sequence[Any] | None = None,
        static_args: StaticArgs | None = None,
        eager: bool = False,
    ):
        self.fun, self.sdef, self.leaves, self.layout = fun, sdef, leaves, layout
        self.policy, self.arg_policies, self.arg_named = policy, arg_policies, arg_named
        self.caller_objects, self.static_args = caller_objects, static_args
        self.eager = eager


def prepare(req: Request) -> Prepared:
    """Step 1: the inputs rebuilt from ``req.leaves``, ready for :meth:`Prepared.call`."""
    root, objs = req.sdef.unflatten_nodes(req.leaves)
    return Prepared(req, root, objs)


class Prepared:
    """The inputs of one run, rebuilt: ``root`` (the ``(*args, kwargs)`` tree) and ``objs``
    (its object at each node); ``args`` and ``kwargs``, the dynamic arguments the function
    gets. What the next steps compare against is taken here, before the function runs."""

    def __init__(self, req: Request, root: Any, objs: list):
        self.req, self.root, self.objs = req, root, objs
        self.info: list = req.sdef.node_info()
        self.args, self.kwargs = req.layout.split(root)
        # node -> its argument's policy, for a call mixing them (None: ``req.policy`` for all).
        self.node_policy: dict[int, Policy] | None = None
        if req.arg_policies is not None:
            self.node_policy = node_policies(
                req.fun, req.sdef, self.info, objs, req.layout, req.arg_policies, req.arg_named
            )
        self.unstable = unstable_static_data(root, self.info)
        # Each custom node's attributes before the call, with their values: an attribute
        # holding the same plain dict or list after it was changed in place (``writes``).
        self.own_attributes = {
            k: dict(vars(o))
            for k, (o, e) in enumerate(zip(objs, self.info, strict=True))
            if isinstance(e, NodeInfo)
            and e.node_type not in (list, dict)
            and hasattr(o, "__dict__")
        }
        # Static objects (``register_static``: the node's aux data is the object itself) are
        # the caller's own objects inside the function too; under strict what it does to them,
        # and to the plain data they hold, is checked directly (``static_snapshot``).
        self.statics: dict[int, list] = {}
        if req.policy.mutations == "error" or self.node_policy is not None:
            self.statics = {
                k: static_snapshot(o)
                for k, (o, e) in enumerate(zip(objs, self.info, strict=True))
                if isinstance(e, NodeInfo)
                and e.arity == 0
                and e.data is o
                and self.policy_of(k).mutations == "error"
            }
        self.watched: dict = {}
        if req.caller_objects is not None:
            self.watched = watch_callers(req.caller_objects, objs, self.info)

    def policy_of(self, k: int) -> Policy:
        """The policy of input node ``k``: its argument's."""
        if self.node_policy is None:
            return self.req.policy
        return self.node_policy.get(k, self.req.policy)

    def call(self) -> Called:
        """Step 2: run the function on the rebuilt arguments, static ones put back."""
        args, kwargs = self.args, self.kwargs
        if self.req.static_args is not None:
            total, positional, keywords = self.req.static_args
            it = iter(args)
            args = tuple(positional[i] if i in positional else next(it) for i in range(total))
            kwargs = {**kwargs, **keywords}
        try:
            with running_on(self.objs, None if self.req.eager else current_trace()):
                out = self.req.fun(*args, **kwargs)
        except UnexpectedTracerError as exc:  # JAX's, where treeclone can name the fix
            self.check_escaped(_native.leaves(self.root), exc)
            raise
        return Called(self, out)

    def check_escaped(self, leaves: Sequence[Any], cause: BaseException | None = None) -> None:
        """The error naming the place and the fix when one of ``leaves``, the arguments' after
        the call, is a traced value of a JAX transformation that has returned: the function
        changed the container in place inside ``jax.lax.scan``, ``jax.vmap``, ... (JAX keeps
        only what its function returns), which neither write-back nor JAX can carry."""
        x = first_escaped(leaves)
        if x is not None:
            where = leaf_path(self.root, self.req.layout, x) or "its result"
            try:
                raise_escaped(self.req.fun, x, where, self.req.policy)
            except ValueError as exc:
                raise exc from cause


class Called:
    """The function has run: ``out`` is its result (a transformation may replace it, checked or
    constrained, before :meth:`diff`)."""

    def __init__(self, prepared: Prepared, out: Any):
        self.prepared, self.out = prepared, out

    def diff(self) -> Diffed:
        """Step 3: what the function did to each input container, checked by its policy."""
        p, req = self.prepared, self.prepared.req
        if p.watched and req.caller_objects is not None:
            check_callers(req.fun, req.caller_objects, p.watched, req.sdef, p.objs, req.layout)
        self._check_static_objects()
        container_index = {
            id(o): k
            for k, (o, e) in enumerate(zip(p.objs, p.info, strict=True))
            if isinstance(e, NodeInfo) and e.node_type is not NoneType
        }
        try:
            post = flatten_after(p.root, self.out, p.objs, container_index)
            handed_over = None
        except Exception as exc:
            self._check_cycles(exc, container_index)
            # An input the function consumed (equinox's State once set): it takes its
            # successor's contents (``consumed``), then everything reads again.
            handed_over = take_successors(p, self.out, container_index)
            if handed_over is None:
                raise
            post = flatten_after(p.root, self.out, p.objs, container_index)
        if req.policy.mutations != "discard":  # clone's copies are dropped with what they hold
            p.check_escaped(post[0])
        post_info = post[1].node_info()
        returned = returned_nodes(post_info, post[2], container_index)
        if handed_over:
            returned |= handed_over  # a successor returned returns the input it replaced
        writes = self._container_writes(post, post_info, container_index)
        origin_of, origin_node, mutated = writes.origin_of, writes.origin_node, writes.mutated
        self._check_unreturned(mutated, returned)
        if p.node_policy is not None:  # only alias's containers keep an origin
            for n in [n for n, k in origin_node.items() if p.policy_of(k).mutations != "propagate"]:
                del origin_of[n]  # fresh containers, as under their own policy
        held = {n: h for n, h in writes.held.items() if n in origin_of}
        return Diffed(self, post, origin_of, mutated, held)

    def _check_cycles(self, exc: Exception, container_index: dict[int, int]) -> None:
        """The error for a container the function left containing itself (``exc``: the
        flatten's, naming the internal tree), naming the user's argument and key path. In an
        input container the function detached from the arguments (``x = state["a"]; del
        state["a"]; x.append(x)``), a change it does not return: strict's ``MutationError``,
        alias's ``ValueError`` (no pytree holds a cycle, so it cannot be written back into
        the caller's container); elsewhere the cycle's own ``ValueError``, naming the root
        (an argument, or the result). Nothing has been written."""
        if not (isinstance(exc, ValueError) and str(exc).startswith("cycle detected")):
            return
        p, req = self.prepared, self.prepared.req
        found = cyclic_part(p.root, self.out, (req.sdef, p.objs), container_index, req.layout)
        if found is None:
            return
        where, k, named = found
        if k is None:
            raise named from exc
        if p.policy_of(k).mutations == "error":
            change = (None, f"detached from the arguments and changed in place: {named}", None)
            raise_mutation_error(req.fun, [(k, [change])], req.sdef, p.objs, req.layout)
        raise ValueError(
            see(
                "cyclic-tree",
                f"{qualname(req.fun)} took the {type(p.objs[k]).__name__} at {where} out of "
                f"its arguments and made it contain itself ({named}). Under policy "
                f"{policy_name(p.policy_of(k))} what a function does to a container it "
                "detached is written back into the caller's container, as plain Python leaves "
                "it, but a container that contains itself is not a pytree, so it cannot be: "
                "nothing was written. Break the cycle before the function returns, or use "
                "policy='clone' (what jax.jit does: the caller's container is left as it was).",
            )
        ) from exc

    def _check_static_objects(self) -> None:
        """Strict's check of the static objects it watches: a change is put back, then raised."""
        p = self.prepared
        changed = {k: found for k, snap in p.statics.items() if (found := static_changes(snap))}
        if changed:
            for found in changed.values():
                for _, obj, state in found:
                    restore_static_state(obj, state)
            raise_static_mutation(p.req.fun, changed, p.req.sdef, p.objs, p.req.layout)

    def _container_writes(
        self, post: tuple, post_info: list, container_index: dict[int, int]
    ) -> Writes:
        """For each input container found after the call: its ``Origin`` (by result node,
        ``writes.container_writes``), the input node of each origin, the attributes holding
        leaves left as they came (``held``), and what changed, per input node
        (``mutated``)."""
        p, req = self.prepared, self.prepared.req
        post_objs = post[2]

        def traced_static(k: int) -> None:
            raise_traced_static_data(req.fun, k, req.sdef, p.objs, req.layout)

        writes = container_writes(
            (p.info, p.objs),
            (post_info, post_objs),
            container_index,
            p.own_attributes,
            traced_static,
        )
        mutated: list[tuple[int, list]] = []
        entries = (p.info, post_info)
        for n in writes.found:
            k = writes.origin_node[n]
            keys, outside = writes.custom.get(n, (None, ()))
            changes = describe_changes(
                p.info[k], post_info[n], p.objs, post_objs, entries, keys, k not in p.unstable
            )
            for name in outside:
                if p.policy_of(k).mutations == "propagate":
                    raise_outside_attribute(req.fun, k, name, req.sdef, p.objs, req.layout)
                changes.append((None, f"attribute {name!r} set outside the pytree", None))
            if changes:
                mutated.append((k, changes))
        writes.mutated = mutated
        return writes

    def _check_unreturned(self, mutated: list[tuple[int, list]], returned: set[int]) -> None:
        """Each argument's own rule for a container changed in place and not returned:
        strict's ``MutationError``, clone's report (alias writes it back)."""
        p, req = self.prepared, self.prepared.req
        unreturned = [(k, c) for k, c in mutated if k not in returned]
        bad = [(k, c) for k, c in unreturned if p.policy_of(k).mutations == "error"]
        if bad:
            raise_mutation_error(req.fun, bad, req.sdef, p.objs, req.layout)
        lost = [(k, c) for k, c in unreturned if p.policy_of(k).mutations == "discard"]
        if lost and not report_off(None):
            lines = mutation_lines(lost, req.sdef, p.objs, req.layout)
            if p.node_policy is None:
                report_discarded(req.fun, lines, None, policy_name(req.policy))
            else:
                assert req.arg_policies is not None
                remedy = per_argument_remedy(
                    [k for k, _ in lost], p.info, req.layout, req.arg_policies
                )
                chosen = "'clone' (chosen for these arguments)"
                report_discarded(req.fun, lines, None, chosen, remedy)


class Diffed:
    """What a run did, ready to become a plan: the result's structure (``result_def``), its
    leaves and objects, the ``Origin`` of each result node written back (``origins``; None:
    a fresh container) and ``result_child`` (under alias the result is the pair ``(inputs,
    outputs)`` and its child 1 is the function's; None: the result is the function's own).
    ``mutated``: per input container changed in place, its changes (``describe_changes``)."""

    def __init__(
        self,
        called: Called,
        post: tuple,
        origin_of: dict[int, Any],
        mutated: list,
        held: dict[int, HeldLeaves] | None = None,
    ):
        self.called, self.mutated = called, mutated
        req = called.prepared.req
        self.held: dict[int, HeldLeaves] = {}  # by result node, as ``origins``
        if req.policy.mutations == "propagate":
            self.result_leaves, self.result_def, self.result_objs = post
            self.origins: list[Any] = [origin_of.get(n) for n in range(self.result_def.num_nodes)]
            self.result_child: int | None = 1
            self.held = held or {}
        else:
            self.result_leaves, self.result_def, self.result_objs = _native.flatten_shared(
                called.out
            )
            self.origins = [None] * self.result_def.num_nodes
            self.result_child = None

    @property
    def out(self) -> Any:
        """The function's result."""
        return self.called.out

    @property
    def prepared(self) -> Prepared:
        return self.called.prepared

    def plan(
        self, keep_inputs: Sequence[bool] | None = None, forced: Sequence[bool] | None = None
    ) -> Plan:
        """Step 4: the ``CallPlan``. A result leaf that is an input leaf is handed back as the
        caller's, unless ``keep_inputs[slot]`` is False (the input was donated or resharded)
        or ``forced[r]`` is True for result leaf ``r`` (vmap's batched outputs): the
        computation outputs it then."""
        in_leaves = self.prepared.req.leaves
        slot_of = {id(leaf): s for s, leaf in enumerate(in_leaves)}
        sources: list[Any] = []
        outputs: list[Any] = []
        # For each result leaf, its index in ``in_leaves + outputs`` (for next_inputs).
        pool_index: dict[int, int] = {}
        produced: set[int] = set()  # input slots whose leaf the computation outputs
        for r, leaf in enumerate(self.result_leaves):
            s = slot_of.get(id(leaf))
            if (
                s is not None
                and in_leaves[s] is leaf
                and (keep_inputs is None or keep_inputs[s])
                and (forced is None or not forced[r])
            ):
                sources.append(Source.Input(slot=s))
                pool_index.setdefault(id(leaf), s)
            else:
                sources.append(Source.Output(index=len(outputs)))
                pool_index.setdefault(id(leaf), len(in_leaves) + len(outputs))
                outputs.append(leaf)
                if s is not None and in_leaves[s] is leaf:
                    produced.add(s)
        origins = self.origins
        if produced and self.held:
            # An input leaf the computation outputs (donated, resharded, placed, batched) is
            # written into the custom node that holds it, as into a dict (rule J7).
            origins = list(origins)
            for n, held in self.held.items():
                origin = held.origin(produced)
                if origin is not None:
                    origins[n] = origin
        plan = _native.CallPlan(
            self.result_def,
            sources,
            origins,
            self.result_child,
            write_custom,
            self.prepared.req.sdef,
            self.enclosing_writes(),
        )
        return Plan(plan, outputs, pool_index)

    def enclosing_writes(self) -> EnclosingWrites | None:
        """Rule J31's check for a plan that writes into the caller's containers (None when
        it writes none): ``CallPlan.apply`` runs it inside an enclosing JAX transformation."""
        if not any(o is not None for o in self.origins):
            return None
        req = self.prepared.req
        return EnclosingWrites(qualname(req.fun), req.sdef, req.layout)

    def next_inputs(self, plan: Plan) -> tuple[tuple[int, ...], tuple[int, ...]] | bool | None:
        """Where the arguments' leaves are after a call (``writes.next_inputs``), for
        ``jit_partial``'s cache; False when an argument left alone (a policy per argument)
        was changed: the caller's objects do not hold what the function saw."""
        p = self.prepared
        if p.node_policy is not None and any(
            p.policy_of(k).mutations != "propagate" for k, _ in self.mutated
        ):
            return False
        written = sorted(k for k, _ in self.mutated)
        before = (p.req.sdef, p.info, p.objs)
        return next_inputs(p.req.policy, p.root, before, p.req.leaves, plan.pool_index, written)


class Plan:
    """The native ``CallPlan`` (``plan.apply(caller_leaves, caller_objects, outputs)`` gives the
    call's result and performs the write-back under alias) and ``outputs``, the result leaves
    the computation must produce (the rest are the caller's own inputs)."""

    __slots__ = ("outputs", "plan", "pool_index")

    def __init__(self, plan: Any, outputs: list, pool_index: dict[int, int]):
        self.plan, self.outputs, self.pool_index = plan, outputs, pool_index
