"""``treeclone.cond`` and ``treeclone.switch`` with a policy.

Each takes ``jax.lax.cond``'s (``jax.lax.switch``'s) arguments plus ``policy=``: ``"clone"``
(the default: the call is JAX's own), ``"alias"`` (the call is the ``if`` it stands for, on the
caller's objects: the taken branch's in-place mutations of the operands reach the caller, a
returned operand is the caller's same object), ``"strict"`` (a branch that mutates an operand
without returning it is a :class:`~treeclone.MutationError`) or a
:class:`~treeclone.Policy`. A ``with treeclone.policy(...)`` block overrides the policy of
every call made inside it.

How it works under ``alias`` and ``strict``: the operands are flattened with identity (the
same array twice is one operand) and ``jax.lax.cond``/``switch`` gets, for each branch, a
function of the distinct leaves that rebuilds the operands, runs the branch on them and
records what it did (the lift's trace: what one ``treeclone.jit`` call records). Since only one
branch runs but every one is traced, every branch must leave the same thing behind: each
returns the same flat list, the new value at every leaf position of ``(operands, result)``
(a leaf no branch writes is one JAX forwards, so it costs nothing and the caller keeps its own
array). Once all branches are traced their plans are checked to agree (the same structure, the
same caller containers at the same places; a clear error naming the key path where they do
not) and joined into one: a leaf some branch writes comes from the computation, every other
from the caller; a custom node's attributes written are those any branch writes. That plan
then applies the outputs to the caller, as ``treeclone.jit`` does.
"""

from __future__ import annotations

import collections
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from treeclone import _lift, _native, _trace
from treeclone._jax_compat import (
    INITIAL_RESULT_PATHS,
    DebugInfo,
    DictKey,
    fun_sourceinfo,
    is_ref,
    keystr,
)
from treeclone._lift import Naming, as_jit_outputs, reporting
from treeclone._native import EntryInfo, Origin, Source
from treeclone._writeback import write_custom as _write_custom
from treeclone.call import call as _call
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy_spec,
    for_call,
    policy_override,
)

__all__ = ["cond", "switch"]

# CallPlan's stub types the write-back hook with two arguments; it is called with three.
_WRITE_CUSTOM: Any = _write_custom

_NO_OPERAND: Any = object()


def _operands(operands: tuple, operand: Any) -> tuple:
    """``operand=`` as JAX reads it (the same TypeError when both are given)."""
    if operand is _NO_OPERAND:
        return operands
    if operands:
        raise TypeError(
            "if 'operand' keyword is passed then no positional operands can be passed, got "
            f"operand={operand} and positional operands {operands}"
        )
    return (operand,)


def _noop() -> None:
    return None


def _operand_policies(policy: PolicySpec | ArgPolicies, branch: Any) -> Policy | ArgPolicies:
    """``policy=`` of a cond or switch: one policy, or a dict per operand, whose names are
    ``branch``'s positional parameters (``true_fun``'s, the first branch's: the names messages
    give the operands) and whose positions are the operands'. A block's policy wins."""
    spec = as_policy_spec(policy, branch)
    if isinstance(spec, ArgPolicies) and spec.names:
        # The operands are passed by position: a name must be one of the branch's positional
        # parameters (as_policy_spec has then given it that position too).
        try:
            params = inspect.signature(branch).parameters.values()
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            positional = {p.name for p in params if p.kind in kinds}
        except (TypeError, ValueError):
            positional = set()
        for name, _ in spec.names:
            if name not in positional:
                who = getattr(branch, "__qualname__", None) or repr(branch)
                raise ValueError(
                    f"policy names {name!r}, which is not a positional parameter of {who}: the "
                    "operands are passed by position, so a policy names them by the first "
                    "branch's parameter names or by their positions"
                )
    return policy_override.get() or spec


def _disabled_and_concrete(selector: Any) -> bool:
    """Whether JAX would call the taken branch directly (``jax.disable_jit`` and a concrete
    predicate or index) instead of tracing every branch."""
    disabled = jax.config.jax_disable_jit  # type: ignore[attr-defined]
    return bool(disabled) and not isinstance(selector, jax.core.Tracer)


def cond(
    pred: Any,
    true_fun: Callable[..., Any],
    false_fun: Callable[..., Any],
    *operands: Any,
    operand: Any = _NO_OPERAND,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Any:
    """``jax.lax.cond(pred, true_fun, false_fun, *operands)`` with a policy.

    Under ``clone`` the call is ``jax.lax.cond``'s own. Under ``alias`` it is the ``if`` it
    stands for, run on the caller's objects::

        if pred:
            return true_fun(*operands)
        else:
            return false_fun(*operands)

    The taken branch's in-place mutations of the operands reach the caller (as concrete
    arrays when called eagerly; inside ``jit`` as values of its trace), and an operand a
    branch returns is the caller's same object. Both branches are traced, as by JAX (even
    with a concrete ``pred``), so both must leave the operands with the same structure: they
    may write different leaves, but a key one adds and the other does not is a ``ValueError``
    naming the key path. Under ``strict`` a branch that mutates an operand without returning
    it is a :class:`~treeclone.MutationError`, whichever branch is taken.

    >>> import jax.numpy as jnp, treeclone
    >>> def hit(state):
    ...     state["hits"] = state["hits"] + 1
    ...     return state["x"] * 2
    >>> def miss(state):
    ...     state["misses"] = state["misses"] + 1
    ...     return state["x"]
    >>> state = {"x": jnp.array(3.0), "hits": 0, "misses": 0}
    >>> treeclone.cond(True, hit, miss, state, policy="alias")
    Array(6., dtype=float32, weak_type=True)
    >>> int(state["hits"]), int(state["misses"])  # the caller's dict, updated by hit
    (1, 0)
    >>> treeclone.cond(True, hit, miss, state, policy="strict")
    Traceback (most recent call last):
    ...
    treeclone.policies.MutationError: hit mutated its inputs in place without returning them ...
      state['hits']: replaced
    ...
    """
    chosen = _operand_policies(policy, true_fun)
    if not (callable(true_fun) and callable(false_fun)):
        # jax.lax.cond's old form cond(pred, x_true, f_true, x_false, f_false), translated as
        # JAX translates it.
        if callable(false_fun) and len(operands) == 2 and callable(operands[1]):
            x_true, f_true, x_false, f_false = true_fun, false_fun, *operands
            return cond(
                pred,
                lambda x, _: f_true(x),
                lambda _, x: f_false(x),
                x_true,
                x_false,
                policy=chosen,
            )
        raise TypeError("lax.cond: true_fun and false_fun arguments should be callable.")
    operands = _operands(operands, operand)
    if chosen is CLONE:
        _lift.check_call(Naming(true_fun), operands, {})  # a cycle: rule 14's ValueError
        return jax.lax.cond(pred, reporting(true_fun), reporting(false_fun), *operands)
    if _disabled_and_concrete(pred):
        jax.lax.cond(pred, _noop, _noop)  # jax's checks of pred, its messages
        return _call(true_fun if pred else false_fun, *operands, policy=chosen)
    call = _lift.flatten_call(Naming(true_fun), operands, {})
    lifted = _lifted("cond", [false_fun, true_fun], ["false_fun", "true_fun"], call, chosen)
    return lifted.run(
        call,
        lambda ws, leaves: jax.lax.cond(pred, ws[1], ws[0], *leaves),
        lambda: None if isinstance(pred, jax.core.Tracer) else int(bool(pred)),
    )


def switch(
    index: Any,
    branches: Sequence[Callable[..., Any]],
    *operands: Any,
    operand: Any = _NO_OPERAND,
    policy: PolicySpec | ArgPolicies = "clone",
) -> Any:
    """``jax.lax.switch(index, branches, *operands)`` with a policy.

    Under ``clone`` the call is ``jax.lax.switch``'s own. Under ``alias`` it is the indexed
    call it stands for, on the caller's objects (``index`` clamped as JAX clamps it)::

        return branches[min(max(index, 0), len(branches) - 1)](*operands)

    with the rules of :func:`cond`: every branch is traced and must leave the operands with
    the same structure (writing different leaves is fine); the taken one's mutations reach
    the caller; under ``strict`` any branch that mutates an operand it does not return is a
    :class:`~treeclone.MutationError`. A single branch is called directly, as JAX does, under
    the policy's rules (``treeclone.call``).

    >>> import jax.numpy as jnp, treeclone
    >>> def scale(p):
    ...     p["w"] = p["w"] * 2
    >>> def shift(p):
    ...     p["b"] = p["b"] + 1
    >>> p = {"w": jnp.ones(2), "b": jnp.zeros(2)}
    >>> treeclone.switch(5, [scale, shift], p, policy="alias")  # 5 is clamped to 1
    >>> p
    {'w': Array([1., 1.], dtype=float32), 'b': Array([1., 1.], dtype=float32)}
    """
    first = next(iter(branches), None) if isinstance(branches, (list, tuple)) else None
    chosen = _operand_policies(policy, first)
    operands = _operands(operands, operand)
    if chosen is CLONE:
        if all(callable(b) for b in branches) and len(branches):
            _lift.check_call(Naming(branches[0]), operands, {})
        # ``branches`` stays bound: the reporting functions hold the branches weakly.
        given = branches
        if isinstance(branches, (list, tuple)):
            given = [reporting(b) for b in branches]
        return jax.lax.switch(index, given, *operands)
    branches = tuple(branches)
    if len(branches) == 1 or (_disabled_and_concrete(index) and branches):
        jax.lax.switch(index, [_noop] * len(branches))  # jax's checks, its messages
        only = min(max(int(index), 0), len(branches) - 1)
        return _call(branches[only], *operands, policy=chosen)
    if not all(callable(b) for b in branches) or not branches:
        return jax.lax.switch(index, branches)  # jax's error
    names = [f"branch {i}" for i in range(len(branches))]
    call = _lift.flatten_call(Naming(branches[0]), operands, {})
    lifted = _lifted("switch", list(branches), names, call, chosen)
    return lifted.run(
        call,
        lambda ws, leaves: jax.lax.switch(index, ws, *leaves),
        lambda: (
            None
            if isinstance(index, jax.core.Tracer)
            else min(max(int(index), 0), len(branches) - 1)
        ),
    )


# --- the lift ------------------------------------------------------------------------------------


class _Record:
    """What tracing one branch left behind: its plan's parts and, per leaf position of the
    plan's structure (its ``Leaf`` entries in order), the slot, the operand slot it hands back
    as it came in (None: a new value), and its abstract value; the branch result's JAX
    structure and the abstract values of its leaves (to report a mismatch as JAX does)."""

    __slots__ = (
        "avals",
        "def_",
        "info",
        "inputs",
        "origins",
        "out_avals",
        "out_def",
        "refs",
        "result_child",
        "slots",
    )

    def __init__(self, traced: _trace.Traced, inputs: list, avals: list, refs: tuple):
        self.def_: Any = traced.result_def
        self.origins: list[Any] = traced.origins
        self.result_child: int | None = traced.result_child
        self.info: list[Any] = self.def_.node_info()
        self.slots: list[int] = [e.slot for e in self.info if isinstance(e, EntryInfo.Leaf)]
        self.inputs: list[int | None] = inputs
        self.avals: list[Any] = avals
        # The positions that hold a JAX Ref: the operand's own, handed back as it came in, and
        # not output by the branch (JAX never returns a Ref).
        self.refs: tuple[int, ...] = refs
        out_leaves, out_def = jax.tree_util.tree_flatten(traced.out)
        self.out_def: Any = out_def
        self.out_avals: list[Any] = [_aval(x) for x in out_leaves]


class _RefAval(tuple):
    """A JAX Ref's abstract value ``(shape, dtype)``: unequal to an array's of the same type."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is _RefAval and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


def _aval(x: Any) -> Any:
    try:
        aval = jax.api_util.shaped_abstractify(x)
    except TypeError:
        return None
    if not hasattr(aval, "shape"):
        return aval
    pair = (tuple(aval.shape), np.dtype(aval.dtype))
    return _RefAval(pair) if is_ref(x) else pair


class _Branch:
    """The function ``jax.lax.cond``/``switch`` traces for one branch: one per branch of a
    :class:`_Lifted`, so JAX reuses its trace for calls of the same structure; each trace
    leaves its record on the ``_Lifted``, which the calls that reuse the trace apply."""

    __slots__ = ("__weakref__", "__wrapped__", "index", "lifted", "names", "naming", "traced_for")

    def __init__(self, lifted: _Lifted, index: int, fun: Callable[..., Any]):
        self.lifted, self.index, self.__wrapped__ = lifted, index, fun
        self.naming = Naming(fun)
        self.names: list[str] | None = None
        self.traced_for = lifted.api

    @property
    def __fun_debug_info__(self) -> Any:
        """How jax's messages (a traced value used as a bool, ...) name the branch and its
        operands: the branch's own source and parameter names, as for the branch itself."""
        if DebugInfo is None:
            return None
        try:
            if self.names is None:
                self.names = self.lifted.call.slot_names(self.naming)
            return DebugInfo(
                self.traced_for,
                fun_sourceinfo(self.__wrapped__),
                tuple(self.names),
                INITIAL_RESULT_PATHS,
            )
        except Exception:  # noqa: BLE001 - naming is best effort; never fail a call over it
            return None

    def __call__(self, *leaves: Any) -> list:
        lifted, call = self.lifted, self.lifted.call
        prepared = _lift.begin(
            self.__wrapped__,
            lifted.spec,
            self.naming,
            call.sdef,
            list(leaves),
            None,
            caller_objects=call.objects,
        )
        traced = prepared.call().diff()
        result_leaves = traced.result_leaves
        info = traced.result_def.node_info()
        columns = [result_leaves[e.slot] for e in info if isinstance(e, EntryInfo.Leaf)]
        slot_of = {id(x): s for s, x in enumerate(leaves)}
        inputs = [slot_of.get(id(x)) for x in columns]
        refs = tuple(p for p, x in enumerate(columns) if is_ref(x))
        record = _Record(traced, inputs, [_aval(x) for x in columns], refs)
        for p in refs:
            if inputs[p] is None:
                raise self._foreign_ref_error(record, p)
        lifted.record(self.index, record)
        if refs:
            # A Ref stays where it is, the operand's own: JAX passes it in and never returns
            # it (the plans read it from the operands, as jit's plan hands back an input).
            dropped = set(refs)
            return [x for p, x in enumerate(columns) if p not in dropped]
        return columns

    def _foreign_ref_error(self, record: _Record, p: int) -> ValueError:
        n = [n for n, e in enumerate(record.info) if isinstance(e, EntryInfo.Leaf)][p]
        where = _PathNamer(self.lifted, record).path(n)
        return ValueError(
            f"treeclone.{self.lifted.api}: {self.lifted.names[self.index]} leaves a JAX Ref at "
            f"{where} that is not an operand's own Ref (one it made, or took from elsewhere). "
            "A branch of jax.lax.cond cannot return a Ref, so only the operands' own Refs can "
            "stay in the operands (read them and write them through ref[...]); put an array "
            "there instead."
        )


class _Lifted:
    """The lifted branches of :func:`cond` or :func:`switch` under a policy other than
    ``clone``, for one call structure (the branches, the policy, the operands' structure with
    sharing and their leaves' abstract values): kept (``_lifted``) so that JAX finds its
    traces of the same wrappers again, as it does for the user's own functions under
    ``clone``, and holding what the latest trace of each branch recorded."""

    def __init__(
        self,
        api: str,
        branches: list[Callable[..., Any]],
        names: list[str],
        num_operands: int,
        policy: Policy | ArgPolicies,
    ):
        self.api, self.branches, self.names, self.spec = api, branches, names, policy
        # The operands' policies (a policy per operand: each its own, the call under their
        # combination, as for jit).
        self.policy, self.arg_policies = for_call(policy, range(num_operands), [])
        naming = Naming(branches[-1] if api == "cond" else branches[0])  # true_fun's names
        self.layout = _trace.Layout(num_operands, [naming.name(i) for i in range(num_operands)])
        self.records: list[_Record | None] = [None] * len(branches)
        self.plans: dict[int | None, Any] = {}
        self.local = threading.local()
        self.lock = threading.Lock()
        self.wrappers = [_Branch(self, i, f) for i, f in enumerate(branches)]

    @property
    def call(self) -> _lift.Call:
        """The call this thread is making (its caller objects, for the trace's messages)."""
        return self.local.call

    def record(self, index: int, record: _Record) -> None:
        """Keep what tracing branch ``index`` recorded and, once every branch has a record,
        check that their plans agree, before JAX compares their outputs. A branch whose trace
        failed (the check raised in it) is traced again at the next call while JAX reuses
        the others' traces: its new record is checked against theirs."""
        with self.lock:
            self.records[index] = record
            self.plans.clear()
            complete = all(r is not None for r in self.records)
        if complete:
            self.check()

    def run(
        self,
        call: _lift.Call,
        bind: Callable[[list, list], Any],
        taken_branch: Callable[[], int | None],
    ) -> Any:
        """Call ``jax.lax.cond``/``switch`` (``bind``) on the branches' wrappers and the
        operands' distinct leaves, then apply the plan: the taken branch's own when the
        predicate (index) is concrete, so the caller sees exactly what that branch did (an
        array it did not write stays the caller's same object); else the joined plan."""
        saved = getattr(self.local, "call", None)
        self.local.call = call
        try:
            columns = bind(self.wrappers, call.leaves)
        finally:
            self.local.call = saved
        if any(r is None for r in self.records):  # JAX traces every branch; a guard
            raise RuntimeError(f"treeclone.{self.api}: a branch was not traced")
        first: _Record = self.records[0]  # type: ignore[assignment]
        if first.refs:
            # The Refs' positions were not output (every branch has them at the same places,
            # each the same operand's: check()); the plans read them from the operands.
            dropped, given = set(first.refs), iter(columns)
            columns = [None if p in dropped else next(given) for p in range(len(first.slots))]
        taken = taken_branch()  # after JAX has checked the predicate (index)
        plan = self.plans.get(taken)
        if plan is None:
            plan = self.plan() if taken is None else self.taken_plan(taken)
            self.plans[taken] = plan
        leaves = call.leaves
        if self.policy.mutations != "propagate":
            # strict gives jax.lax.cond's results: an operand handed back is a jax.Array
            # (rule C13; alias keeps plain Python's, the caller's own object).
            leaves = as_jit_outputs(leaves, range(len(leaves)))
        return plan.apply(leaves, call.objects, list(columns))

    # --- checks, once every branch is traced ---

    def check(self) -> None:
        records: list[_Record] = self.records  # type: ignore[assignment]
        order = [1, 0] if self.api == "cond" else list(range(len(records)))  # as JAX names them
        first = records[order[0]]
        for i in order[1:]:
            r = records[i]
            if r.out_def != first.out_def or not _same_avals(r.out_avals, first.out_avals):
                raise self._jax_output_error()
        for i in order[1:]:
            r = records[i]
            problem = self._compare(first, r)
            if problem is not None:
                where, said0, said1 = problem
                raise ValueError(
                    f"treeclone.{self.api} (policy {self.policy.name or self.policy!r}): "
                    f"{self.names[order[0]]} and {self.names[i]} leave different structures "
                    "behind, and only one of them runs, so the other's changes cannot be "
                    "written back with the same plan. Every branch must leave the operands "
                    "(and return its result) with the same structure, the same containers at "
                    "the same places and the same shapes and dtypes; branches may write "
                    "different leaves.\n"
                    f"  {where}: {self.names[order[0]]} leaves {said0}, {self.names[i]} leaves "
                    f"{said1}"
                )

    def _jax_output_error(self) -> Exception:
        """JAX's own error for branches whose results differ, raised by ``jax.lax.cond``
        (``switch``) on functions returning zeros of each branch's result structure, which
        JAX's message names by the user's branches (``__wrapped__``)."""
        dummies = []
        for fun, r in zip(self.branches, self.records, strict=True):
            assert r is not None

            def dummy(r: _Record = r) -> Any:
                return r.out_def.unflatten(
                    [np.zeros(*a) if isinstance(a, tuple) else 0 for a in r.out_avals]
                )

            dummy.__wrapped__ = fun  # type: ignore[attr-defined]
            dummies.append(dummy)
        try:
            if self.api == "cond":
                jax.eval_shape(lambda: jax.lax.cond(True, dummies[1], dummies[0]))
            else:
                jax.eval_shape(lambda: jax.lax.switch(0, dummies))
        except TypeError as e:
            return e
        return TypeError(f"treeclone.{self.api}: the branches' results differ")

    def _compare(self, a: _Record, b: _Record) -> tuple[str, str, str] | None:
        """The first place, top down, where two branches' plans differ (other than in which
        leaves they write): ``(key path, what a leaves there, what b leaves there)``."""
        ia, ib = a.info, b.info
        pos_a = _positions(ia)
        pos_b = _positions(ib)
        paths = _PathNamer(self, a)
        mapped: dict[int, int] = {}
        agenda = [(len(ia) - 1, len(ib) - 1)]
        while agenda:
            na, nb = agenda.pop()
            ea, eb = ia[na], ib[nb]
            problem = None
            if type(ea) is not type(eb):
                problem = (_say(self, a, na), _say(self, b, nb))
            elif isinstance(ea, EntryInfo.Ref):
                if mapped.get(ea.target) != eb.target:
                    problem = (_say(self, a, na), _say(self, b, nb))
            elif isinstance(ea, EntryInfo.Leaf):
                av_a, av_b = a.avals[pos_a[na]], b.avals[pos_b[nb]]
                if av_a != av_b:
                    problem = (_say_aval(av_a), _say_aval(av_b))
                elif isinstance(av_a, _RefAval) and a.inputs[pos_a[na]] != b.inputs[pos_b[nb]]:
                    # A Ref is never output: each place keeps the same operand's Ref.
                    problem = (self._say_ref(a, pos_a[na]), self._say_ref(b, pos_b[nb]))
            else:
                oa, ob = a.origins[na], b.origins[nb]
                if (
                    ea.node_type is not eb.node_type
                    or ea.arity != eb.arity
                    or not _trace.same_data(ea.data, eb.data)
                    or (oa is None) != (ob is None)
                    or (oa is not None and (oa.node != ob.node or oa.writable != ob.writable))
                ):
                    keyed = _key_difference(ea, eb)
                    if keyed is not None:
                        key, in_a = keyed
                        where = paths.path(na) + keystr((DictKey(key),))
                        there, missing = "a value under this key", "no such key"
                        return (where, *((there, missing) if in_a else (missing, there)))
                    problem = (_say(self, a, na), _say(self, b, nb))
                elif oa is not None and _keys_moved(oa) != _keys_moved(ob):
                    problem = (_say_order(oa), _say_order(ob))
            if problem is not None:
                return (paths.path(na), *problem)
            mapped[na] = nb
            if isinstance(ea, EntryInfo.Node):
                agenda.extend(reversed(list(zip(ea.children, eb.children, strict=True))))
        return None

    def _say_ref(self, r: _Record, p: int) -> str:
        slot = r.inputs[p]
        if slot is None:  # not an operand's Ref: the branch's trace has raised already
            return "a Ref that is not an operand's"
        naming = Naming(self.branches[-1] if self.api == "cond" else self.branches[0])
        return f"the Ref from {self.call.slot_path(naming, slot)}"

    # --- the plans ---

    def taken_plan(self, taken: int) -> Any:
        """Branch ``taken``'s own plan, its values read from the joined outputs (one per leaf
        position of the structure every branch shares)."""
        r = self.records[taken]
        assert r is not None
        sources: list[Any] = [None] * r.def_.num_leaves
        for p, s in enumerate(r.slots):
            if sources[s] is None:
                given = r.inputs[p]
                sources[s] = Source.Output(index=p) if given is None else Source.Input(slot=given)
        return _native.CallPlan(r.def_, sources, r.origins, r.result_child, _WRITE_CUSTOM)

    def plan(self) -> Any:
        records: list[_Record] = self.records  # type: ignore[assignment]
        n_pos = len(records[0].slots)
        # Positions that hold one value in every branch are one class (one output).
        classes: dict[tuple, int] = {}
        rep = []
        for p in range(n_pos):
            key = tuple(r.slots[p] for r in records)
            rep.append(classes.setdefault(key, p))
        chosen = next((r for r in records if len(set(r.slots)) == len(classes)), None)
        if chosen is not None:
            def_, slots = chosen.def_, chosen.slots
        else:
            def_ = _refined(records[0])
            slots = [e.slot for e in def_.node_info() if isinstance(e, EntryInfo.Leaf)]
        sources: list[Any] = [None] * def_.num_leaves
        for p in range(n_pos):
            if sources[slots[p]] is not None:
                continue
            given = {r.inputs[p] for r in records}
            slot = given.pop() if len(given) == 1 else None
            if slot is not None:
                sources[slots[p]] = Source.Input(slot=slot)
            else:
                sources[slots[p]] = Source.Output(index=rep[p])
        origins = [_join_origins([r.origins[n] for r in records]) for n in range(def_.num_nodes)]
        return _native.CallPlan(def_, sources, origins, records[0].result_child, _WRITE_CUSTOM)


_LIFTED: collections.OrderedDict[Any, _Lifted] = collections.OrderedDict()
_LIFTED_LOCK = threading.Lock()
_LIFTED_SIZE = 256


def _aval_key(x: Any) -> Any:
    try:
        aval = jax.api_util.shaped_abstractify(x)
    except TypeError:
        return type(x)
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    return (shape, dtype, getattr(aval, "weak_type", False), is_ref(x))


def _lifted(
    api: str,
    branches: list[Callable[..., Any]],
    names: list[str],
    call: _lift.Call,
    policy: Policy | ArgPolicies,
) -> _Lifted:
    """The :class:`_Lifted` for this call structure, from the last ``_LIFTED_SIZE`` used (a
    fresh one when a branch cannot be a dict key)."""
    key = (api, tuple(branches), policy, call.sdef, tuple(_aval_key(x) for x in call.leaves))
    try:
        hash(key)
    except TypeError:
        return _Lifted(api, branches, names, len(call.args), policy)
    with _LIFTED_LOCK:
        found = _LIFTED.get(key)
        if found is not None:
            _LIFTED.move_to_end(key)
            return found
        found = _LIFTED[key] = _Lifted(api, branches, names, len(call.args), policy)
        if len(_LIFTED) > _LIFTED_SIZE:
            _LIFTED.popitem(last=False)
        return found


def _same_avals(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b, strict=True))


def _positions(info: list) -> dict[int, int]:
    """Entry index -> leaf position (the index of its ``Leaf`` among the entries)."""
    leaves = [n for n, e in enumerate(info) if isinstance(e, EntryInfo.Leaf)]
    return {n: p for p, n in enumerate(leaves)}


def _key_difference(ea: Any, eb: Any) -> tuple[Any, bool] | None:
    """For two dicts of one type whose keys differ: the first key only one has, and whether
    it is the first's."""
    if ea.node_type is not eb.node_type or ea.node_type not in (dict, collections.OrderedDict):
        return None
    ka, kb = ea.data, eb.data
    if not (isinstance(ka, (list, tuple)) and isinstance(kb, (list, tuple))):
        return None
    for k in ka:
        if k not in kb:
            return k, True
    for k in kb:
        if k not in ka:
            return k, False
    return None


def _keys_moved(o: Any) -> tuple | None:
    """The key order a dict's write-back imposes (None: kept keys keep their place)."""
    return tuple(o.key_order) if o.reordered and o.key_order is not None else None


def _say_order(o: Any) -> str:
    order = _keys_moved(o)
    return "its keys in their order" if order is None else f"its keys reordered to {list(order)}"


def _say_aval(aval: Any) -> str:
    if isinstance(aval, _RefAval):
        shape, dtype = aval
        return f"a Ref of type {dtype.name}{list(shape)}"
    if isinstance(aval, tuple):
        shape, dtype = aval
        return f"a value of type {dtype.name}{list(shape)}"
    return f"a value of type {aval}"


def _say(lifted: _Lifted, r: _Record, n: int) -> str:
    """What one branch leaves at entry ``n`` of its plan's structure, in words."""
    e = r.info[n]
    if isinstance(e, EntryInfo.Leaf):
        return _say_aval(r.avals[_positions(r.info)[n]])
    if isinstance(e, EntryInfo.Ref):
        return f"the same object as at {_PathNamer(lifted, r).path(e.target)}"
    ty = e.node_type
    if ty is type(None):
        what = "None"
    elif ty is dict or (isinstance(e.data, (list, tuple)) and issubclass(ty, dict)):
        what = f"a {ty.__name__} with keys {list(e.data or ())}"
    elif ty in (list, tuple):
        what = f"a {ty.__name__} of {e.arity}"
    else:
        what = f"a {ty.__name__} with {e.arity} children"
    o = r.origins[n]
    if o is None:
        return what + (" (a new object)" if ty is not type(None) else "")
    own = _PathNamer(lifted, r).caller_path(o.node)
    return f"{what} (the caller's object from {own})"


class _PathNamer:
    """Key paths of the entries of one branch's plan structure, for messages: the operands by
    the branch's parameter names, the result as ``result``."""

    def __init__(self, lifted: _Lifted, r: _Record):
        self.lifted, self.r = lifted, r
        self.parent: dict[int, tuple[int, int]] = {}
        for n, e in enumerate(r.info):
            if isinstance(e, EntryInfo.Node):
                for j, c in enumerate(e.children):
                    self.parent[c] = (n, j)

    def caller_path(self, k: int) -> str:
        """The key path of the caller's container at node ``k`` of the call's structure."""
        call = self.lifted.call
        paths = _trace.Paths(call.sdef, call.objects, self.lifted.layout).paths
        return paths.get(k, "?") or "(the operands)"

    def path(self, n: int) -> str:
        steps: list[tuple[int, int]] = []
        while n in self.parent:
            steps.append(self.parent[n])
            n = self.parent[n][0]
        steps.reverse()  # from the top down
        if self.r.result_child is None:  # strict: the structure is the result's
            return "result" + "".join(self._key(m, j) for m, j in steps)
        if not steps:
            return "(the call)"
        (_, part), rest = steps[0], steps[1:]
        if part == self.r.result_child:
            return "result" + "".join(self._key(m, j) for m, j in rest)
        if part != 0:
            return "(a container the branch detached)" + "".join(self._key(m, j) for m, j in rest)
        if not rest:
            return "(the operands)"
        (_, i), rest = rest[0], rest[1:]
        return self.lifted.layout.arg_name(i) + "".join(self._key(m, j) for m, j in rest)

    def _key(self, m: int, j: int) -> str:
        e = self.r.info[m]
        obj = None
        o = self.r.origins[m]
        if o is not None:
            obj = self.lifted.call.objects[o.node]
        try:
            keys = _trace.child_keys(obj, e)
            return keystr((keys[j],))
        except Exception:  # noqa: BLE001 - a name for a message
            return f"[{j}]"


def _join_origins(origins: list) -> Any:
    """One origin for a node from every branch's (checked to be the same caller object): the
    attributes written are those any branch writes."""
    first = origins[0]
    if first is None:
        return None
    attrs: Any = ()
    for o in origins:
        if o.attrs is None:
            attrs = None
            break
        attrs = tuple(dict.fromkeys((*attrs, *o.attrs)))
    direct: Any = []
    for o in origins:
        if o.direct is None:
            direct = None
            break
        direct = list(dict.fromkeys((*direct, *[tuple(d) for d in o.direct])))
    if direct is not None and len({name for name, _ in direct}) != len(direct):
        direct = None
    return Origin(
        node=first.node,
        old_children=list(first.old_children),
        same_data=all(o.same_data for o in origins),
        writable=first.writable,
        key_order=first.key_order,
        reordered=any(o.reordered for o in origins),
        attrs=attrs,
        direct=direct,
        by_entry=all(o.by_entry for o in origins),
        old_keys=first.old_keys,
    )


def _refined(r: _Record) -> Any:
    """Branch ``r``'s plan structure with every leaf position its own slot: the branches
    share leaves in ways no one branch's structure has (each position gets its own output
    then, and positions that hold one value in every branch the same one). Built by
    rebuilding the structure's containers around distinct placeholder leaves."""
    info = r.info
    built: list[Any] = []
    pos = _positions(info)
    for n, e in enumerate(info):
        if isinstance(e, EntryInfo.Leaf):
            aval = r.avals[pos[n]]
            if isinstance(aval, tuple):
                built.append(np.broadcast_to(np.zeros((), aval[1]), aval[0]))
            else:
                built.append(np.zeros(()))
        elif isinstance(e, EntryInfo.Ref):
            built.append(built[e.target])
        else:
            children = [built[c] for c in e.children]
            built.append(_build(e.node_type, e.data, children))
    _, def_, _ = _native.flatten_shared(built[-1])
    rebuilt: list[Any] = def_.node_info()
    same = len(rebuilt) == len(info) and all(
        type(x) is type(y)
        and (
            not isinstance(x, EntryInfo.Node)
            or (x.node_type is y.node_type and x.arity == y.arity and x.children == y.children)
        )
        for x, y in zip(rebuilt, info, strict=True)
    )
    if not same or def_.num_leaves != len(pos):
        raise ValueError(
            "treeclone: the branches share arrays between places of the operands in different "
            "ways, and the structure could not be rebuilt to hold them apart (a pytree node "
            "whose unflatten does not keep its children); use policy='clone'"
        )
    return def_


def _build(ty: type, data: Any, children: list) -> Any:
    if ty is list:
        return list(children)
    if ty is tuple:
        return tuple(children)
    if ty is dict:
        return dict(zip(data, children, strict=True))
    if ty is type(None):
        return None
    if issubclass(ty, tuple) and hasattr(ty, "_fields"):
        return ty(*children)
    from treeclone._jax_compat import unflatten_node

    return unflatten_node(ty, data, children)
