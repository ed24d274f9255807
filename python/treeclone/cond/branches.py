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

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.core import Tracer

from treeclone import _effects, _lift
from treeclone._docs import see
from treeclone._jax_compat import is_ref
from treeclone._lift import Naming, as_jit_outputs, leaf_rule, reporting, with_static
from treeclone._native import EntryInfo
from treeclone.call import call as _call
from treeclone.cond.join import (
    BranchRecord,
    PathNamer,
    aval_of,
    first_difference,
    joined_plan,
    taken_plan,
    zeros_of,
)
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
                    see(
                        "policy-argument",
                        f"policy names {name!r}, which is not a positional parameter of {who}: the "
                        "operands are passed by position, so a policy names them by the first "
                        "branch's parameter names or by their positions",
                    )
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
    traced: str | Callable[[Any], bool] | None = None,
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

    ``traced`` decides leaf by leaf what is traced, as for :func:`treeclone.jit`
    (``"arrays"``: equinox's rule); the other leaves of the operands (an equinox Module's
    activation, a string) reach the branches as they are, and one a branch leaves in the
    operands or returns comes back as it is: every branch must leave the same value (of the
    same type) there, or it is a ``ValueError`` naming the key path.

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
        return _old_form(pred, true_fun, false_fun, operands, chosen, traced)
    operands = _operands(operands, operand)
    rule = leaf_rule(traced)
    if chosen is CLONE and rule is None:
        _lift.check_cycles(Naming(true_fun), operands, {})  # a cycle: rule J17's ValueError
        return jax.lax.cond(pred, reporting(true_fun), reporting(false_fun), *operands)
    if _disabled_and_concrete(pred):
        jax.lax.cond(pred, _noop, _noop)  # jax's checks of pred, its messages
        return _call(true_fun if pred else false_fun, *operands, policy=chosen)
    call = _lift.flatten_call(Naming(true_fun), operands, {}, traced=rule, hashed=False)
    names = ["false_fun", "true_fun"]
    lifted = _lifted("cond", [false_fun, true_fun], names, call, chosen, rule)
    return lifted.call_branches(
        call,
        lambda ws, leaves: jax.lax.cond(pred, ws[1], ws[0], *leaves),
        lambda: None if isinstance(pred, jax.core.Tracer) else int(bool(pred)),
    )


def _old_form(
    pred: Any, true_fun: Any, false_fun: Any, operands: tuple, chosen: Any, traced: Any
) -> Any:
    """jax.lax.cond's old form ``cond(pred, x_true, f_true, x_false, f_false)``, translated as
    JAX translates it (and JAX's error where it is not that form either)."""
    if callable(false_fun) and len(operands) == 2 and callable(operands[1]):
        x_true, f_true, x_false, f_false = true_fun, false_fun, *operands
        return cond(
            pred,
            lambda x, _: f_true(x),
            lambda _, x: f_false(x),
            x_true,
            x_false,
            policy=chosen,
            traced=traced,
        )
    raise TypeError("lax.cond: true_fun and false_fun arguments should be callable.")


def switch(
    index: Any,
    branches: Sequence[Callable[..., Any]],
    *operands: Any,
    operand: Any = _NO_OPERAND,
    policy: PolicySpec | ArgPolicies = "clone",
    traced: str | Callable[[Any], bool] | None = None,
) -> Any:
    """``jax.lax.switch(index, branches, *operands)`` with a policy.

    Under ``clone`` the call is ``jax.lax.switch``'s own. Under ``alias`` it is the indexed
    call it stands for, on the caller's objects (``index`` clamped as JAX clamps it)::

        return branches[min(max(index, 0), len(branches) - 1)](*operands)

    with the rules of :func:`cond`: every branch is traced and must leave the operands with
    the same structure (writing different leaves is fine); the taken one's mutations reach
    the caller; under ``strict`` any branch that mutates an operand it does not return is a
    :class:`~treeclone.MutationError`; ``traced`` as for :func:`cond`. A single branch is
    called directly, as JAX does, under the policy's rules (``treeclone.call``).

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
    rule = leaf_rule(traced)
    if chosen is CLONE and rule is None:
        if all(callable(b) for b in branches) and len(branches):
            _lift.check_cycles(Naming(branches[0]), operands, {})
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
    call = _lift.flatten_call(Naming(branches[0]), operands, {}, traced=rule, hashed=False)
    lifted = _lifted("switch", list(branches), names, call, chosen, rule)
    return lifted.call_branches(
        call,
        lambda ws, leaves: jax.lax.switch(index, ws, *leaves),
        lambda: (
            None
            if isinstance(index, jax.core.Tracer)
            else min(max(int(index), 0), len(branches) - 1)
        ),
    )


# --- the lift ------------------------------------------------------------------------------------


class _BranchNames:
    """The names jax's messages give a branch's inputs (the operands' leaves, as the branch
    names its parameters), worked out when first asked, then kept: every call of a
    :class:`_Lifted` has the same structure."""

    __slots__ = ("branch", "names")

    def __init__(self, branch: _Branch):
        self.branch = branch
        self.names: list[str] | None = None

    def __iter__(self) -> Iterator[str]:
        if self.names is None:
            self.names = self.branch.current_call().input_names(self.branch.naming)
        return iter(self.names)


class _Branch(_lift.Runner):
    """The function ``jax.lax.cond``/``switch`` traces for one branch: one per branch of a
    :class:`_Lifted`, so JAX reuses its trace for calls of the same structure; each trace
    leaves its record on the ``_Lifted``, which the calls that reuse the trace apply. Its
    current call (:meth:`~treeclone._lift.Runner.calling`) is the operands'; jax's messages
    name its inputs as the branch names its parameters (:class:`_BranchNames`)."""

    def __init__(self, lifted: _Lifted, index: int, fun: Callable[..., Any]):
        super().__init__(fun, lifted.spec, Naming(fun), lifted.traced)
        self.lifted, self.index, self.__wrapped__ = lifted, index, fun
        self.traced_for = lifted.api
        self.names = _BranchNames(self)

    def __call__(self, *given: Any) -> list:
        lifted, call = self.lifted, self.current_call()
        leaves = with_static(given, call.static)  # the static ones (traced=) back
        diffed = self.begin(call.sdef, leaves).call().diff()
        result_leaves = diffed.result_leaves
        info = diffed.result_def.node_info()
        columns = [result_leaves[e.slot] for e in info if isinstance(e, EntryInfo.Leaf)]
        slot_of = {id(x): s for s, x in enumerate(leaves)}
        inputs = [slot_of.get(id(x)) for x in columns]
        refs = tuple(p for p, x in enumerate(columns) if is_ref(x))
        record = BranchRecord(diffed, inputs, [aval_of(x) for x in columns], refs)
        rule = self.traced
        if rule is not None:
            record.statics = {
                p: x for p, x in enumerate(columns) if not isinstance(x, Tracer) and not rule(x)
            }
        for p in refs:
            if inputs[p] is None:
                raise self._foreign_ref_error(record, p)
        lifted.record(self.index, record)
        if refs or record.statics:
            # A Ref stays where it is, the operand's own: JAX passes it in and never returns
            # it (the plans read it from the operands, as jit's plan hands back an input). A
            # static leaf is not JAX's: the plans take it from the record.
            dropped = {*refs, *record.statics}
            return [x for p, x in enumerate(columns) if p not in dropped]
        return columns

    def _foreign_ref_error(self, record: BranchRecord, p: int) -> ValueError:
        n = [n for n, e in enumerate(record.info) if isinstance(e, EntryInfo.Leaf)][p]
        where = PathNamer(self.lifted.call, self.lifted.layout, record).path(n)
        return ValueError(
            see(
                "cond-branches",
                f"treeclone.{self.lifted.api}: {self.lifted.names[self.index]} leaves a JAX Ref at "
                f"{where} that is not an operand's own Ref (one it made, or took from elsewhere). "
                "A branch of jax.lax.cond cannot return a Ref, so only the operands' own Refs can "
                "stay in the operands (read them and write them through ref[...]); put an array "
                "there instead.",
            )
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
        traced: Callable[[Any], bool] | None,
    ):
        self.api, self.branches, self.names, self.spec = api, branches, names, policy
        self.traced = traced  # the traced= rule: what it rejects is static
        # The operands' policies (a policy per operand: each its own, the call under their
        # combination, as for jit).
        self.policy, self.arg_policies = for_call(policy, range(num_operands), [])
        naming = Naming(branches[-1] if api == "cond" else branches[0])  # true_fun's names
        self.layout = _effects.Layout(num_operands, [naming.name(i) for i in range(num_operands)])
        self.records: list[BranchRecord | None] = [None] * len(branches)
        self.plans: dict[int | None, Any] = {}
        self.lock = threading.Lock()
        self.wrappers = [_Branch(self, i, f) for i, f in enumerate(branches)]

    @property
    def call(self) -> _lift.Call:
        """The call this thread is making (its caller objects, for the trace's messages): its
        branches' current call."""
        return self.wrappers[0].current_call()

    def record(self, index: int, record: BranchRecord) -> None:
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

    def call_branches(
        self,
        call: _lift.Call,
        bind: Callable[[list, list], Any],
        taken_branch: Callable[[], int | None],
    ) -> Any:
        """Call ``jax.lax.cond``/``switch`` (``bind``) on the branches' wrappers and the
        operands' distinct leaves, then apply the plan: the taken branch's own when the
        predicate (index) is concrete, so the caller sees exactly what that branch did (an
        array it did not write stays the caller's same object); else the joined plan."""
        with contextlib.ExitStack() as calling:
            for branch in self.wrappers:
                calling.enter_context(branch.calling(call.objects, branch.names, call))
            columns = bind(self.wrappers, call.traced_leaves())
        if any(r is None for r in self.records):  # JAX traces every branch; a guard
            raise RuntimeError(f"treeclone.{self.api}: a branch was not traced")
        first: BranchRecord = self.records[0]  # type: ignore[assignment]
        if first.refs or first.statics:
            # The Refs' positions were not output (every branch has them at the same places,
            # each the same operand's: check()); the plans read them from the operands. Nor
            # were the static leaves', equal in every branch (check()).
            dropped, given = {*first.refs, *first.statics}, iter(columns)
            columns = [
                first.statics.get(p) if p in dropped else next(given)
                for p in range(len(first.slots))
            ]
        taken = taken_branch()  # after JAX has checked the predicate (index)
        plan = self.plans.get(taken)
        if plan is None:
            if taken is None:
                plan = joined_plan(self.records)  # type: ignore[arg-type]
            else:
                plan = taken_plan(self.records[taken])  # type: ignore[arg-type]
            self.plans[taken] = plan
        leaves = call.leaves
        if self.policy.mutations != "propagate":
            # strict gives jax.lax.cond's results: an operand handed back is a jax.Array
            # (rule C13; alias keeps plain Python's, the caller's own object).
            static = () if call.static is None else call.static.slots
            leaves = as_jit_outputs(leaves, [s for s in range(len(leaves)) if s not in static])
        return plan.apply(leaves, call.objects, list(columns))

    # --- checks, once every branch is traced ---

    def check(self) -> None:
        records: list[BranchRecord] = self.records  # type: ignore[assignment]
        order = [1, 0] if self.api == "cond" else list(range(len(records)))  # as JAX names them
        first = records[order[0]]
        for i in order[1:]:
            r = records[i]
            if r.out_def != first.out_def or not _same_avals(r.out_avals, first.out_avals):
                raise self._jax_output_error()
        for i in order[1:]:
            r = records[i]
            problem = first_difference(self.call, self.layout, first, r, self._say_ref)
            if problem is not None:
                where, said0, said1 = problem
                raise ValueError(
                    see(
                        "cond-branches",
                        f"treeclone.{self.api} (policy {self.policy.name or self.policy!r}): "
                        f"{self.names[order[0]]} and {self.names[i]} leave different structures "
                        "behind, and only one of them runs, so the other's changes cannot be "
                        "written back with the same plan. Every branch must leave the operands "
                        "(and return its result) with the same structure, the same containers at "
                        "the same places and the same shapes and dtypes; branches may write "
                        "different leaves.\n"
                        f"  {where}: {self.names[order[0]]} leaves {said0}, {self.names[i]} leaves "
                        f"{said1}",
                    )
                )

    def _jax_output_error(self) -> Exception:
        """JAX's own error for branches whose results differ, raised by ``jax.lax.cond``
        (``switch``) on functions returning zeros of each branch's result structure, which
        JAX's message names by the user's branches (``__wrapped__``)."""
        dummies = []
        for fun, r in zip(self.branches, self.records, strict=True):
            assert r is not None

            def dummy(r: BranchRecord = r) -> Any:
                return r.out_def.unflatten(
                    [zeros_of(a) if isinstance(a, tuple) else 0 for a in r.out_avals]
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
        return TypeError(
            see("cond-branches", f"treeclone.{self.api}: the branches' results differ")
        )

    def _say_ref(self, r: BranchRecord, p: int) -> str:
        slot = r.inputs[p]
        if slot is None:  # not an operand's Ref: the branch's trace has raised already
            return "a Ref that is not an operand's"
        naming = Naming(self.branches[-1] if self.api == "cond" else self.branches[0])
        return f"the Ref from {self.call.slot_path(naming, slot)}"

    # --- the plans ---


_LIFTED: _lift.Kept[_Lifted] = _lift.Kept()


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
    traced: Callable[[Any], bool] | None = None,
) -> _Lifted:
    """The :class:`_Lifted` for this call structure (with the ``traced=`` rule and the leaves
    it leaves static), from the last ones used (a fresh one when a branch cannot be a dict
    key)."""
    avals = tuple(_aval_key(x) for x in call.traced_leaves())
    key = (api, tuple(branches), policy, call.sdef, avals, traced, call.static)
    return _LIFTED.get(key, lambda: _Lifted(api, branches, names, len(call.args), policy, traced))


def _same_avals(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b, strict=True))
