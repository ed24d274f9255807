"""The step forms (functional, in place, nnx) and the training loops that run them: one
``Runner`` per form, the floor's (``floor_runner``) among them.

The workloads call ``runners.floor_runner`` through this module, at each call:
``benches/floor_probe.py`` swaps it here for its variants.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax

from ..contenders import FLOOR, NNX_PARTIAL, TC_PARTIAL, floor_hold
from .base import Runner, TraceCounter


def jitted(jit: Callable[..., Any], fn: Callable[..., Any], *bound: Any, donate=()) -> Any:
    """``jit(fn, *bound)``, with ``donate_argnums=donate`` when it donates."""
    if donate:
        return jit(fn, *bound, donate_argnums=donate)
    return jit(fn, *bound)


# --------------------------------------------------------------------------- step forms


def functional_step(loss_fn: Callable[..., Any], tx: Any) -> Callable[..., Any]:
    import optax

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def inplace_step(loss_fn: Callable[..., Any], tx: Any) -> Callable[..., Any]:
    import optax

    def train_step(state, x, y):
        params = state["params"]
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state["opt_state"] = tx.update(grads, state["opt_state"], params)
        state["params"] = optax.apply_updates(params, updates)
        return loss

    return train_step


def nnx_step(nnx_loss: Callable[..., Any]) -> Callable[..., Any]:
    from flax import nnx

    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(nnx_loss)(model, x, y)
        optimizer.update(model, grads)
        return loss

    return train_step


def unjitted_losses(
    step: Callable[..., Any], params: Any, opt_state: Any, x: Any, y: Any, n: int
) -> tuple[list[float], Any]:
    """The losses of ``n`` plain-Python (un-jitted) calls of the functional step
    ``params, opt_state, loss = step(params, opt_state, x, y)``, the reference a workload's
    contenders are checked against, and the parameters it ends with."""
    losses = []
    for _ in range(n):
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))
    return losses, params


def functional_runner(jit, fn, params, opt_state, x, y, *, donate=(), **kw: Any) -> Runner:
    """``params, opt_state, loss = f(params, opt_state, x, y)``; ``state()``: the pair."""
    traces = TraceCounter()
    f = jitted(jit, traces.wrap(fn), donate=donate)
    p, o = params, opt_state

    def run(n: int):
        nonlocal p, o
        pp, oo, loss = p, o, None
        for _ in range(n):
            pp, oo, loss = f(pp, oo, x, y)
        p, o = pp, oo
        return loss, (pp, oo)

    kw.setdefault("state", lambda: (p, o))
    return Runner(run=run, traces=traces, **kw)


def inplace_runner(jit, fn, state: Any, x, y, *, bound: tuple = (), donate=(), **kw: Any) -> Runner:
    """``f(*bound, state, x, y)``, which updates ``state`` in place; ``state()``: ``state``.
    The outputs waited on are ``bound`` and ``state``: every leaf of the state."""
    traces = TraceCounter()
    f = jitted(jit, traces.wrap(fn), donate=donate)

    def run(n: int):
        loss = None
        for _ in range(n):
            loss = f(*bound, state, x, y)
        return loss, ((*bound, state) if bound else state)

    kw.setdefault("state", lambda: state)
    return Runner(run=run, traces=traces, **kw)


def partial_runner(
    jit_partial, fn, state: Any, x, y, *, bound: tuple = (), donate=(), **kw: Any
) -> Runner:
    """``jit_partial(step, *bound, state)(x, y)``: the state bound once (the outputs waited
    on: ``bound`` and ``state``)."""
    traces = TraceCounter()
    f = jitted(jit_partial, traces.wrap(fn), *bound, state, donate=donate)

    def run(n: int):
        loss = None
        for _ in range(n):
            loss = f(x, y)
        return loss, ((*bound, state) if bound else state)

    kw.setdefault("state", lambda: state)
    return Runner(run=run, traces=traces, **kw)


def floor_runner(
    jit,
    run_on_state: Callable[..., Any],
    state: Any,
    x,
    y,
    *,
    hold: int | None = None,
    donate: bool = False,
    **kw: Any,
) -> Runner:
    """The floor: one ``jax.jit`` of ``state``'s arrays, each its own positional argument, that
    returns the arrays the step replaces and the loss as one flat tuple; the loop keeps each
    call's arrays for ``hold`` calls more (default ``floor_hold`` of the state's platform).
    ``run_on_state(state, x, y) -> (loss, state_after)`` runs at trace time only.
    ``state()`` is the state unflattened from the current arrays.

    ``donate=True`` is the floor with donation (``contenders.FLOOR_DON_IS``): the arrays the
    step replaces, found by a trace ahead (``jax.eval_shape``, not counted), are donated, and
    the loop holds nothing (a donated array is gone after the call).

    Each choice is the fastest measured by ``benches/floor_probe.py`` (docs/benchmarks.md):
    on a TPU v5e, letting go of the replaced arrays right after the call that reads them,
    while its computation may still run, is what made the list form of the floor slower than
    treeclone's lean path, which holds them; on the CPU holding them is what costs. A list
    argument and a list of outputs cost at most 2% more than positional arrays and a flat
    tuple. The next flat tuple is gathered from the old one and the outputs by one
    ``operator.itemgetter`` (made at the trace), so the loop does no Python work per leaf.
    Without ``donate`` it donates nothing: the contenders it is the floor of donate nothing.
    """
    flat, treedef = jax.tree.flatten(state)
    n_leaves = len(flat)
    gather: list[Callable[[tuple], tuple]] = []
    replaced: list[int] = []

    def flat_step(*args):
        leaves, (x, y) = list(args[:n_leaves]), args[n_leaves:]
        loss, after = run_on_state(jax.tree.unflatten(treedef, leaves), x, y)
        new = jax.tree.leaves(after)
        changed = [i for i, (a, b) in enumerate(zip(new, leaves, strict=True)) if a is not b]
        # Leaf i of the next call: the old one (index i of old + outputs) or its output.
        where = dict(zip(changed, range(n_leaves, n_leaves + len(changed)), strict=True))
        gather[:] = [_tuple_getter([where.get(i, i) for i in range(n_leaves)])]
        replaced[:] = changed
        return (*(new[i] for i in changed), loss)

    traces = TraceCounter()
    options: dict[str, Any] = {}
    if donate:  # which arrays the step replaces: one trace ahead, outside the counted ones
        jax.eval_shape(flat_step, *flat, x, y)
        options["donate_argnums"] = tuple(replaced)
        hold = 0
    f = jit(traces.wrap(flat_step), **options)
    leaves = tuple(flat)
    if hold is None:
        hold = floor_hold(_platform(flat))
    held: tuple[Any, ...] = (None,) * hold  # the last calls' arrays, kept alive

    def run(steps: int):
        nonlocal leaves, held
        loss = None
        for _ in range(steps):
            outputs = f(*leaves, x, y)
            if hold:
                held = (*held[1:], leaves)
            leaves = gather[0](leaves + outputs)
            loss = outputs[-1]
        return loss, leaves

    kw.setdefault("state", lambda: jax.tree.unflatten(treedef, list(leaves)))
    return Runner(run=run, traces=traces, **kw)


def _platform(leaves: list[Any]) -> str:
    """The platform of the first array among ``leaves`` (JAX's default backend if none)."""
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            return next(iter(leaf.devices())).platform
    return jax.default_backend()


def _tuple_getter(indices: list[int]) -> Callable[[tuple], tuple]:
    """``operator.itemgetter(*indices)``, a tuple for one index or none too."""
    if not indices:
        return lambda t: ()
    if len(indices) == 1:
        (i,) = indices
        return lambda t: (t[i],)
    return operator.itemgetter(*indices)


def inplace_form(
    contender: str, jit, fn, state: dict[str, Any], x, y, *, donate: bool = False, **kw: Any
) -> Runner:
    """The runner of an in-place contender (``INPLACE``) for ``fn(state, x, y) -> loss``;
    ``donate``: ``state`` donated (the floor: the arrays the step replaces)."""
    if contender == TC_PARTIAL:
        return partial_runner(jit, fn, state, x, y, donate=(0,) if donate else (), **kw)
    if contender == FLOOR:
        run_on_state = lambda st, x, y: (fn(st, x, y), st)  # noqa: E731
        return floor_runner(jit, run_on_state, state, x, y, donate=donate, **kw)
    return inplace_runner(jit, fn, state, x, y, donate=(0,) if donate else (), **kw)


def nnx_arrays(*roots: Any) -> Callable[[tuple[Any, Any]], list[Any]]:
    """The loss and the arrays of every nnx Variable under ``roots``, the Variables found once:
    the nnx forms update the same Variable objects in place. Waiting on ``(model, optimizer)``
    itself flattens the module tree in Python at every batch (2.2 ms at depth 100 on a 2-core
    CPU, 0.1 ms a step in batches of 21), a cost of the harness that only the nnx forms paid.
    """
    from flax import nnx

    variables = [v for _, v in nnx.iter_graph(roots) if isinstance(v, nnx.Variable)]
    return lambda outputs: [outputs[0], *(v.get_raw_value() for v in variables)]


def state_arrays(outputs: Any) -> list[Any]:
    """The arrays of a functional nnx form's outputs (the loss and a new ``nnx.State``), by
    treeclone's native flatten: waiting on the outputs themselves runs ``nnx.State``'s Python
    flatten through jax.tree_util at every batch (0.42 against 0.09 ms at depth 100 on a 2-core
    CPU), a cost of the harness that only the functional forms paid. The harness checks once
    that these are all of the outputs' arrays (``harness._unwaited``)."""
    import treeclone.tree_util

    return treeclone.tree_util.tree_leaves(outputs)


def nnx_donation(contender: str) -> tuple[int, ...]:
    """The ``donate_argnums`` that donate the model and the optimizer under ``contender``'s
    form: ``nnx.jit_partial`` hands its bound arguments to ``jax.jit`` as one list, argument 0
    (flax 0.12.8), so its 0 donates both and its 1 would donate the batch; ``nnx.jit`` and
    treeclone's wrappers, ``jit_partial`` included, count each argument."""
    return (0,) if contender == NNX_PARTIAL else (0, 1)


def nnx_form(contender: str, jit, fn, model, optimizer, x, y, *, donate=(), **kw: Any) -> Runner:
    """The runner of an nnx contender (``NNX_FORMS``) for ``fn(model, optimizer, x, y)``;
    ``state()``: ``(model, optimizer)``."""
    if contender != NNX_PARTIAL:
        return nnx_runner(jit, fn, model, optimizer, x, y, donate=donate, **kw)
    traces = TraceCounter()
    f = jitted(jit, traces.wrap(fn), model, optimizer, donate=donate)

    def run(n: int):
        loss = None
        for _ in range(n):
            loss = f(x, y)
        return loss, (model, optimizer)

    kw.setdefault("state", lambda: (model, optimizer))
    return Runner(run=run, traces=traces, arrays=nnx_arrays(model, optimizer), **kw)


def nnx_runner(jit, fn, model, optimizer, x, y, *, donate=(), **kw: Any) -> Runner:
    traces = TraceCounter()
    f = jitted(jit, traces.wrap(fn), donate=donate)

    def run(n: int):
        loss = None
        for _ in range(n):
            loss = f(model, optimizer, x, y)
        return loss, (model, optimizer)

    kw.setdefault("state", lambda: (model, optimizer))
    return Runner(run=run, traces=traces, arrays=nnx_arrays(model, optimizer), **kw)
