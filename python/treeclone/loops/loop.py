"""``treeclone.scan``, ``fori_loop`` and ``while_loop`` with a policy.

Each takes the arguments of the JAX loop (``jax.lax.scan``, ``jax.lax.fori_loop``,
``jax.lax.while_loop``) plus ``policy=``. Under ``clone`` (the default) a call is the JAX
loop's own. Under ``alias`` a call behaves as the Python loop it stands for, run on the
caller's objects::

    carry = init                        # scan
    for i in range(n):
        x = tree_map(lambda a: a[i], xs)  # the slice: a view of row i of each leaf
        carry, ys[i] = f(carry, x)
        for a, row in zip(leaves(xs), leaves(x)):
            a[i] = row                  # what the body left in the slice is row i
    return carry, stack(ys)

The body may update the carry in place and return it (an optimizer's ``update`` method, a
counter), or build and return a new one. What it updates in place and returns at the same place
of the carry is the caller's own object at the end, holding the final state (so ``carry is
init`` when the body returns its argument); what it builds anew is a new object. Under
``strict`` a carry container changed in place and not returned at its place is a
:class:`~treeclone.MutationError` naming its key path, and the caller is never written to.

How: a loop call enters through the lift as every transformation does (``carry.py``: the
carry flattened with identity, the body run through the trace's steps, the loop's rules, the
final write-back by the call's ``CallPlan``). This module runs the JAX loop over it: the JAX
loop carries the call's distinct leaves (and scans over ``xs``'s), and the functions it traces
are kept per kind of call, so that an eager loop called again finds JAX's cached trace.
``docs/semantics.md`` ("scan, fori_loop and while_loop") states the rules and names their
tests.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax

from treeclone import _lift
from treeclone._docs import see
from treeclone._effects import qualname
from treeclone._lift import Naming, leaf_rule, reporting
from treeclone.loops.carry import LoopCall, LoopPlan
from treeclone.loops.rules import (
    NAMINGS,
    STAND_INS,
    XS_NAMING,
    SliceWatch,
    check_shared,
    join_static,
    raise_not_a_jax_type,
    slice_of,
    split_xs,
)
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy_spec,
    policy_override,
)

__all__ = ["fori_loop", "scan", "while_loop"]

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


def _loop_policies(
    policy: PolicySpec | ArgPolicies, api: str
) -> tuple[Policy | ArgPolicies, tuple[Policy, ...]]:
    """The loop's policy as the lift takes it, and that of each of its arguments (scan:
    ``init`` and ``xs``; fori_loop and while_loop: ``init_val``), from one policy or a dict
    naming them by name or position (checked as jit checks a dict); a ``with
    treeclone.policy(...)`` block wins."""
    stand_in = STAND_INS[api]
    chosen = policy_override.get() or as_policy_spec(policy, stand_in)
    count = len(inspect.signature(stand_in).parameters)
    if isinstance(chosen, ArgPolicies):
        return chosen, chosen.per_argument(range(count), [])
    return chosen, (chosen,) * count


# --- the functions the JAX loop traces, kept per kind of call ------------------------------------


class _Names:
    """The names jax's messages give a loop body's inputs, worked out only when asked: the
    key paths of the carried (and scanned) leaves, as the user's function names its
    parameters (``c['t']``, ``x['a']``), not the carried leaves' list."""

    def __init__(self, body: _LoopBody, loop: LoopCall):
        self.body, self.loop = body, loop

    def __iter__(self) -> Iterator[str]:
        params = [self.body.naming.name(i) for i in range(2)]
        return iter(self.body.names(self.loop, params))


class _LoopBody(_lift.Runner):
    """A function a JAX loop traces (``run``, on the JAX loop's arguments), for this thread's
    current loop call; jax's messages name its inputs as the user's function ``fun`` sees
    them (the lift's ``__fun_debug_info__``, from :class:`_Names`). ``names(loop, params)``
    lists them."""

    def __init__(
        self,
        run: Callable[..., Any],
        fun: Any,
        traced_for: str,
        names: Callable[[LoopCall, list[str]], list[str]],
    ):
        super().__init__(fun, CLONE, Naming(fun))
        self.run, self.traced_for, self.names = run, traced_for, names

    def __call__(self, *args: Any) -> Any:
        return self.run(self.current_call(), *args)

    def serving(self, loop: LoopCall) -> contextlib.AbstractContextManager[None]:
        """A context in which this thread's traces of the body are ``loop``'s."""
        return self.calling(None, _Names(self, loop), loop)


class _Entry:
    """The functions a JAX loop traces for one kind of call (the user's functions, the
    carry's structure and types, the loop's options), kept so that JAX finds its cached trace
    again on the next such call instead of tracing and compiling anew. ``record`` is what
    their last trace found, for the calls that reuse it (another thread's, perhaps)."""

    def __init__(self) -> None:
        self.record: LoopPlan | None = None
        self.bodies: tuple[_LoopBody, ...] = ()

    def step(self, loop: LoopCall, *args: Any, **options: Any) -> tuple:
        """The current call's :meth:`LoopCall.step`, its record kept here as the trace ends."""
        out = loop.step(*args, **options)
        self.record = loop.record
        return out


_ENTRIES: _lift.Kept[_Entry] = _lift.Kept()


def _entry(key: Any, make: Callable[[_Entry], tuple]) -> _Entry:
    """The kept :class:`_Entry` for ``key`` (made with ``make`` the first time); a fresh one
    when the key cannot be hashed, or is None."""

    def new() -> _Entry:
        entry = _Entry()
        entry.bodies = make(entry)
        return entry

    return _ENTRIES.get(key, new)


def _run(entry: _Entry, loop: LoopCall, jax_loop: Callable[..., Any]) -> tuple[Any, LoopPlan]:
    """Run ``jax_loop(*entry.bodies)`` for ``loop``; return its result and what the body's
    trace found: this call's, or (JAX reused a trace) the last one's."""
    with contextlib.ExitStack() as stack:
        for body in entry.bodies:
            stack.enter_context(body.serving(loop))
        out = jax_loop(*entry.bodies)
    record = loop.record or entry.record
    assert record is not None  # JAX traced the body, for this call or an earlier one
    return out, record


def _key_of(tree: Any) -> Any:
    """A tree's structure and leaf types, as part of a cache key (None: not one)."""
    try:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return treedef, tuple(jax.api_util.shaped_abstractify(x) for x in leaves)
    except Exception:  # noqa: BLE001 - not a key: JAX will say what is wrong with it
        return None


def _count(lower: Any, upper: Any) -> int | None:
    """How many times ``for i in range(lower, upper)`` runs, when the bounds are concrete."""
    try:
        return max(int(upper) - int(lower), 0)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


def _pair(f: Any, out: Any) -> tuple[Any, Any]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            see(
                "loop-carry",
                f"{qualname(f)}, the body of scan, must return a pair (carry, y), got "
                f"{type(out).__name__}",
            )
        )
    return out[0], out[1]


def _kind(loop: LoopCall) -> tuple:
    """The call's part of a cache key: its structure, policies, leaf types, ``traced=`` rule
    and the leaves it leaves static (the body's trace holds them as constants)."""
    return loop.call.sdef, loop.policies, loop.avals, loop.traced, loop.call.static


def _clone(run: Callable[[], Any], names: tuple[str, ...], args: tuple) -> Any:
    """``run()``, JAX's own loop (policy ``clone``, no ``traced=``); JAX's TypeError for a
    leaf that is not a JAX type is said again naming its key path and ``traced=``."""
    try:
        return run()
    except TypeError as error:
        raise_not_a_jax_type(error, names, args)
        raise


def _ys(ys: Any) -> Any:
    """Scan's stacked results, the static ones (``traced=``) back."""
    return join_static(ys) if isinstance(ys, _lift.Out) else ys


# --- the loops -----------------------------------------------------------------------------------


def scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    _split_transpose: bool = False,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    traced: str | Callable[[Any], bool] | None = None,
) -> tuple[Carry, Y]:
    """``jax.lax.scan(f, init, xs, length, reverse, unroll)`` with a policy.

    Under ``clone`` the call is ``jax.lax.scan``'s own. Under ``alias`` it is the Python loop
    ``for x in slices(xs): carry, y = f(carry, x)`` on the caller's ``init``: the body may
    update the carry in place and return it, and the carry returned is then the caller's same
    object holding the final state. Each slice ``x`` is a view of row i of each leaf of
    ``xs``: what the body does to it in place (a counter, a BatchNorm's statistics in a stack
    of layers) is written back into the caller's ``xs`` as a new stacked array per changed
    leaf, as ``nnx.scan`` does for a module scanned over axis 0. ``ys`` are stacked as by
    ``jax.lax.scan``. Under ``strict`` a carry container (or slice) changed in place and not
    returned is a :class:`~treeclone.MutationError`, and nothing is written back.

    ``traced`` decides leaf by leaf what the loop traces, as for :func:`treeclone.jit`
    (``"arrays"``: equinox's rule); the others (an equinox Module's activation, a string) are
    the loop's constants, as ``eqx.partition``'s static part closed over ``jax.lax.scan``:
    the carry must keep each at every iteration (a changed one is a ValueError naming its key
    path), a slice of ``xs`` holds it as it is, and one in ``y`` comes back as it is, not
    stacked.

    >>> import jax.numpy as jnp, treeclone
    >>> def body(state, x):
    ...     state["total"] = state["total"] + x  # in place
    ...     return state, 2 * x
    >>> state = {"total": jnp.zeros(())}
    >>> carry, ys = treeclone.scan(body, state, jnp.arange(4.0), policy="alias")
    >>> carry is state, state, ys
    (True, {'total': Array(6., dtype=float32)}, Array([0., 2., 4., 6.], dtype=float32))
    """
    spec, (chosen, xs_policy) = _loop_policies(policy, "scan")
    rule = leaf_rule(traced)
    mixed = chosen is not xs_policy
    extra = {"_split_transpose": True} if _split_transpose else {}
    if chosen is CLONE and not mixed and rule is None:
        _lift.check_cycles(NAMINGS["scan"], (init, xs), {})
        return _clone(
            lambda: jax.lax.scan(reporting(f), init, xs, length, reverse, unroll, **extra),
            ("init", "xs"),
            (init, xs),
        )
    options = (length, reverse, unroll, _split_transpose)
    # What the body does to its slice of xs in place and does not return: strict's error, or
    # (xs left alone: clone) clone's report.
    mutations = xs_policy.mutations
    xs_mode = "error" if mutations == "error" else "discard" if mutations == "discard" else None
    if xs is not None and mutations == "propagate":
        both = LoopCall("scan", f, (init, xs), spec, (chosen, xs_policy), rule)
        if not both.shared:
            return _scan_both(f, both, options)
        xs_mode = "shared"  # an array in init and xs: the slice cannot be written back
    return _scan_carry(f, init, xs, (chosen, xs_policy), rule, xs_mode, options)


def _scan_carry(
    f: Callable[..., Any],
    init: Any,
    xs: Any,
    policies: tuple[Policy, Policy],
    rule: Callable[[Any], bool] | None,
    xs_mode: str | None,
    options: tuple,
) -> tuple[Any, Any]:
    """``scan`` with the carry alone through the lift: ``xs`` is not written back (its policy
    is not ``alias``, or it shares an array with ``init``). The JAX loop scans over ``xs``
    itself (over its traced leaves, with ``traced=``) and each slice is watched for what the
    body does to it in place (``xs_mode``, as :class:`SliceWatch` takes it; None: not
    watched)."""
    chosen, xs_policy = policies
    length, reverse, unroll, split = options
    extra = {"_split_transpose": True} if split else {}
    loop = LoopCall("scan", f, (init,), chosen, (chosen,), rule)
    _lift.check_cycles(XS_NAMING, (xs,), {})
    if chosen is not xs_policy:
        check_shared(f, init, xs, policies)
    boxed = rule is not None and xs is not None  # xs's static leaves are not scanned
    scanned: Any = split_xs(xs, rule) if boxed else xs
    xs_key = _key_of(scanned)

    def make(entry: _Entry) -> tuple:
        if boxed:  # the names of the leaves scanned: not the static ones
            xs_paths = scanned.key[0].unflatten([None if x is None else 0 for x in scanned.leaves])
        else:
            xs_paths = [] if xs_key is None else xs_key[0].unflatten([0] * len(xs_key[1]))

        def body(loop: LoopCall, carry: list, x: Any) -> tuple[list, Any]:
            if boxed:
                x = slice_of(x)
            watch = None if xs_mode is None else SliceWatch(x, xs_mode)

            def run(c: Any) -> tuple:
                new, y = _pair(f, f(c, x))
                return (new,), y

            new_carry, y, _ = entry.step(loop, carry, [], run, watch)
            return new_carry, y

        def names(loop: LoopCall, p: list[str]) -> list[str]:  # a slice's key paths are xs's
            return loop.debug_names(p[:1]) + _tree_names(p[1], xs_paths)

        return (_LoopBody(body, f, "scan", names),)

    key = None if xs_key is None else ("scan", f, *_kind(loop), xs_key, xs_policy, options)
    entry = _entry(key, make)
    carried = loop.inputs_of(loop.call.leaves, loop.carried)
    (final, ys), record = _run(
        entry,
        loop,
        lambda body: jax.lax.scan(body, carried, scanned, length, reverse, unroll, **extra),
    )
    if length is None:
        length = next((len(x) for x in jax.tree_util.tree_leaves(scanned)), None)
    return loop.finish(record, list(final), [], length), _ys(ys)


def _tree_names(root: str, tree: Any) -> list[str]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [root + jax.tree_util.keystr(p) for p, _ in flat]


def _scan_both(f: Callable[..., Any], loop: LoopCall, options: tuple) -> tuple[Any, Any]:
    """``scan`` with ``xs`` written back (its policy is ``alias``): each slice is a view of row i
    of the stacked ``xs`` (rule L7). The call is ``(init, xs)``; the JAX loop scans over
    ``xs``'s distinct leaves, its body rebuilds the slice from their rows and hands back the
    slice as it leaves it, and besides ``ys`` emits, stacked, the final row of each ``xs`` leaf
    the body changed (found by the trace, the same at every iteration, as nnx.scan's output of
    a module's state). The one plan writes those and the final carry into the caller's
    objects, all or nothing; a leaf never changed stays the caller's array."""
    length, reverse, unroll, split = options
    extra = {"_split_transpose": True} if split else {}

    def make(entry: _Entry) -> tuple:
        def body(loop: LoopCall, carry: list, rows: list) -> tuple[list, Any]:
            def run(c: Any, x: Any) -> tuple:
                new, y = _pair(f, f(c, x))
                return (new, x), y  # the slice as the body leaves it

            new_carry, y, new_rows = entry.step(loop, carry, rows, run)
            return new_carry, (y, new_rows)

        def names(loop: LoopCall, p: list[str]) -> list[str]:
            return loop.debug_names(p)

        return (_LoopBody(body, f, "scan", names),)

    entry = _entry(("scan", f, *_kind(loop), options), make)
    carried = loop.inputs_of(loop.call.leaves, loop.carried)
    scanned = loop.inputs_of(loop.call.leaves, loop.scanned)
    (final, (ys, rows)), record = _run(
        entry,
        loop,
        lambda body: jax.lax.scan(body, carried, scanned, length, reverse, unroll, **extra),
    )
    if length is None:
        length = next((len(x) for x in scanned if x is not None), None)
    return loop.finish(record, list(final), list(rows), length), _ys(ys)


def fori_loop(
    lower: Any,
    upper: Any,
    body_fun: Callable[[Any, Carry], Carry],
    init_val: Carry,
    *,
    unroll: int | bool | None = None,
    policy: PolicySpec | ArgPolicies = "clone",
    traced: str | Callable[[Any], bool] | None = None,
) -> Carry:
    """``jax.lax.fori_loop(lower, upper, body_fun, init_val, unroll=unroll)`` with a policy.

    Under ``alias`` the call is ``for i in range(lower, upper): val = body_fun(i, val)`` on the
    caller's ``init_val`` (see :func:`scan` for the carry's rules and ``traced``).

    >>> import jax.numpy as jnp, treeclone
    >>> def body(i, acc):
    ...     acc.append(acc.pop() + i)  # a list updated in place
    ...     return acc
    >>> acc = [jnp.zeros((), jnp.int32)]
    >>> treeclone.fori_loop(0, 5, body, acc, policy="alias") is acc, acc
    (True, [Array(10, dtype=int32)])
    """
    _, (chosen,) = _loop_policies(policy, "fori_loop")
    rule = leaf_rule(traced)
    if chosen is CLONE and rule is None:
        _lift.check_cycles(NAMINGS["fori_loop"], (init_val,), {})
        return _clone(
            lambda: jax.lax.fori_loop(lower, upper, reporting(body_fun), init_val, unroll=unroll),
            ("init_val",),
            (init_val,),
        )
    loop = LoopCall("fori_loop", body_fun, (init_val,), chosen, (chosen,), rule)

    def make(entry: _Entry) -> tuple:
        def body(loop: LoopCall, i: Any, slots: list) -> list:
            return entry.step(loop, slots, [], lambda c: ((body_fun(i, c),), None))[0]

        def names(loop: LoopCall, p: list[str]) -> list[str]:
            return [p[0], *loop.debug_names(p[1:])]

        return (_LoopBody(body, body_fun, "fori_loop", names),)

    bounds = _key_of((lower, upper))
    kinds = (type(lower), type(upper), unroll)
    key = ("fori_loop", body_fun, *_kind(loop), bounds, kinds)
    carried = loop.inputs_of(loop.call.leaves, loop.carried)
    final, record = _run(
        _entry(None if bounds is None else key, make),
        loop,
        lambda body: jax.lax.fori_loop(lower, upper, body, carried, unroll=unroll),
    )
    return loop.finish(record, list(final), [], _count(lower, upper))


def while_loop(
    cond_fun: Callable[[Carry], Any],
    body_fun: Callable[[Carry], Carry],
    init_val: Carry,
    *,
    policy: PolicySpec | ArgPolicies = "clone",
    traced: str | Callable[[Any], bool] | None = None,
) -> Carry:
    """``jax.lax.while_loop(cond_fun, body_fun, init_val)`` with a policy.

    Under ``alias`` the call is ``while cond_fun(val): val = body_fun(val)`` on the caller's
    ``init_val`` (see :func:`scan` for the carry's rules and ``traced``); ``cond_fun`` may not
    change the carry in place (an error: JAX's loop carries only what the body returns).

    >>> import jax.numpy as jnp, treeclone
    >>> def body(state):
    ...     state["n"] = state["n"] * 2
    ...     return state
    >>> state = {"n": jnp.ones((), jnp.int32)}
    >>> out = treeclone.while_loop(lambda s: s["n"] < 100, body, state, policy="alias")
    >>> out is state, state
    (True, {'n': Array(128, dtype=int32)})
    """
    _, (chosen,) = _loop_policies(policy, "while_loop")
    rule = leaf_rule(traced)
    if chosen is CLONE and rule is None:
        _lift.check_cycles(NAMINGS["while_loop"], (init_val,), {})
        return _clone(
            lambda: jax.lax.while_loop(reporting(cond_fun), reporting(body_fun), init_val),
            ("init_val",),
            (init_val,),
        )
    loop = LoopCall("while_loop", body_fun, (init_val,), chosen, (chosen,), rule)

    def make(entry: _Entry) -> tuple:
        def cond(loop: LoopCall, slots: list) -> Any:
            return loop.check_untouched(cond_fun, slots)

        def body(loop: LoopCall, slots: list) -> list:
            return entry.step(loop, slots, [], lambda c: ((body_fun(c),), None))[0]

        def names(loop: LoopCall, p: list[str]) -> list[str]:
            return loop.debug_names(p[:1])

        return (
            _LoopBody(cond, cond_fun, "while_cond", names),
            _LoopBody(body, body_fun, "while_body", names),
        )

    key = ("while_loop", cond_fun, body_fun, *_kind(loop))
    final, record = _run(
        _entry(key, make),
        loop,
        lambda cond, body: jax.lax.while_loop(
            cond, body, loop.inputs_of(loop.call.leaves, loop.carried)
        ),
    )
    return loop.finish(record, list(final), [], None)
