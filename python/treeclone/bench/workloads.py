"""The training workloads, and each one written in the idiomatic form for each contender.

A workload knows its data and initial parameters (numpy, from fixed seeds), can run a
plain-Python (un-jitted) reference of its step, and builds a ``Runner`` per contender. Every
form of a step computes the same math; what differs is how state goes in and out:

* ``jax.jit``, ``treeclone.jit[clone]``, ``treeclone.jit[strict]`` and
  ``equinox.filter_jit`` run the functional step ``(params, opt_state, x, y) -> (params,
  opt_state, loss)`` over plain pytrees (equinox's ``filter_jit`` over the same functions);
* ``treeclone.jit[alias]`` runs an in-place step ``step(state, x, y) -> loss`` that assigns
  the new parameters and optimizer state into the ``state`` dict it was given;
* ``treeclone.jit_partial[alias]`` runs the same in-place step with ``state`` bound
  (``jit_partial(step, state)(x, y)``);
* ``flax.nnx.jit`` (graph mode), ``flax.nnx.jit[graph=False]`` (tree mode) and
  ``flax.nnx.jit_partial`` (tree mode, model and optimizer bound) run an ``nnx.Module`` version
  of the model with ``nnx.Optimizer``, updated in place as nnx does;
* ``floor`` is the least a wrapper that donates nothing can do (``contenders.FLOOR_IS``,
  ``floor_runner``): one ``jax.jit`` of the state's arrays, each its own argument, returning
  the arrays the step replaces and the loss as one flat tuple, in a loop that keeps each
  call's arrays a few calls longer on the platforms where treeclone's own loop does.

The seed pattern is the exception: there the same ``train_step(model, x, y, optimizer)``,
whose ``Optimizer`` object is mutated in place and returned, runs under every jit wrapper.

Two more groups (``contenders.Group``) have contenders of their own:

* ``donated``: ``mlp_adam``, ``nnx_train_20``, ``frozen_half`` and ``transformer_adam`` again
  (``<name>_donated``), each contender running the form of its undonated twin
  (``contenders.DONATED_FORM``) with the state it replaces donated (``donate_argnums``; the
  floor donates the arrays its step replaces and holds nothing);
* ``equinox``: ``eqx_mlp_adam``, an equinox Module with a function field under
  ``traced="arrays"``, ``equinox.filter_jit``, and ``jax.jit`` and the floor over
  ``eqx.partition``'s arrays.

Every runner gives its state (``Runner.state``) in a form its workload's contenders share; the
harness compares it with the group baseline's after the check steps.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from . import models as M
from .contenders import (
    BASELINE,
    DONATED,
    EQUINOX,
    EQX,
    FLOOR,
    NNX,
    NNX_PARTIAL,
    NNX_TREE,
    TC_ALIAS,
    TC_ALIAS_PARTITIONED,
    TC_ALIAS_TRACED,
    TC_CLONE_TRACED,
    TC_PARTIAL,
    TC_PARTIAL_TRACED,
    TRAINING,
    Group,
    donated_form,
    floor_hold,
)

# Contenders that run a step which updates its state in place (a dict, or nnx objects).
INPLACE = (TC_ALIAS, TC_PARTIAL, FLOOR)
NNX_FORMS = (NNX, NNX_TREE, NNX_PARTIAL)

STANDARD = "standard"
TIED = "tied"
UNTIED = "untied"


class NotApplicable(Exception):
    """A contender that does not apply to a workload (with the reason)."""


class TraceCounter:
    """Counts how often a step function's Python body runs: once per trace under a jit."""

    def __init__(self) -> None:
        self.n = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            return fn(*args, **kwargs)

        return counted


@dataclass
class Runner:
    """One contender's training loop on one workload.

    ``run(n)`` does ``n`` training steps and returns ``(loss, outputs)``: the last step's loss
    and everything to block on. ``arrays(outputs)``, where given, reads the arrays ``outputs``
    hold without flattening them (the harness waits on those; it checks once that they are
    all of the outputs' arrays). ``verify()`` returns None or why the result is wrong, beyond
    the loss comparison. ``state()``, where given, is the training state after the steps run
    so far, in a form every contender of the workload shares (the harness compares its
    leaves with the group's ``jax.jit``'s after the check steps). ``notes`` are facts worth
    reporting (e.g. object identity).
    """

    run: Callable[[int], tuple[Any, Any]]
    traces: TraceCounter
    arrays: Callable[[tuple[Any, Any]], list[Any]] | None = None
    semantics: str = STANDARD
    verify: Callable[[], str | None] | None = None
    notes: list[str] = field(default_factory=list)
    state: Callable[[], Any] | None = None

    def project(self, view: Callable[[Any], Any]) -> Runner:
        """This runner, its ``state()`` seen through ``view`` (the workload's shared form)."""
        own = self.state
        if own is not None:
            self.state = lambda: view(own())
        return self


def _jit(jit: Callable[..., Any], fn: Callable[..., Any], *bound: Any, donate=()) -> Any:
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


def functional_runner(jit, fn, params, opt_state, x, y, *, donate=(), **kw: Any) -> Runner:
    """``params, opt_state, loss = f(params, opt_state, x, y)``; ``state()``: the pair."""
    traces = TraceCounter()
    f = _jit(jit, traces.wrap(fn), donate=donate)
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
    f = _jit(jit, traces.wrap(fn), donate=donate)

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
    f = _jit(jit_partial, traces.wrap(fn), *bound, state, donate=donate)

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
    f = _jit(jit, traces.wrap(fn), model, optimizer, donate=donate)

    def run(n: int):
        loss = None
        for _ in range(n):
            loss = f(x, y)
        return loss, (model, optimizer)

    kw.setdefault("state", lambda: (model, optimizer))
    return Runner(run=run, traces=traces, arrays=nnx_arrays(model, optimizer), **kw)


def nnx_runner(jit, fn, model, optimizer, x, y, *, donate=(), **kw: Any) -> Runner:
    traces = TraceCounter()
    f = _jit(jit, traces.wrap(fn), donate=donate)

    def run(n: int):
        loss = None
        for _ in range(n):
            loss = f(model, optimizer, x, y)
        return loss, (model, optimizer)

    kw.setdefault("state", lambda: (model, optimizer))
    return Runner(run=run, traces=traces, arrays=nnx_arrays(model, optimizer), **kw)


# --------------------------------------------------------------------------- workloads


class Workload:
    """Base class: data, initial parameters, reference run and per-contender runners."""

    name = ""
    title = ""
    description = ""
    group: Group = TRAINING
    # The class attributes a --tiny run (CI's smoke test) sets: the smallest sizes that run
    # the same code paths.
    tiny: dict[str, Any] = {}
    compared = (
        "Each contender's losses over the check steps against a plain-Python (un-jitted) run "
        "of the functional step from the same initial parameters."
    )
    lr = 1e-3

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        import optax

        self.device = device
        self.preserving = preserving  # contenders under which shared objects stay shared
        self.tx = optax.adam(self.lr)

    def put(self, tree: Any) -> Any:
        """Onto the default device (the chosen one, inside ``jax.default_device``).

        Uncommitted, like the arrays optax and nnx create: mixing committed and uncommitted
        inputs would make the second call compile the step again.
        """
        return jax.device_put(tree)

    def semantics(self, contender: str) -> str:
        return STANDARD

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        raise NotImplementedError

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        raise NotImplementedError


class _ParamsWorkload(Workload):
    """A model given by ``loss_fn(params, x, y)`` and an nnx version, trained with Adam."""

    def params0(self) -> Any:
        raise NotImplementedError

    def loss_fn(self, params, x, y):
        raise NotImplementedError

    def nnx_model(self, classes: dict[str, Any], params: Any) -> Any:
        raise NotImplementedError

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        self.x, self.y = (self.put(a) for a in self.data())

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step = functional_step(self.loss_fn, self.tx)
        params = self.put(self.params0())
        opt_state = self.tx.init(params)
        losses = []
        for _ in range(n):
            params, opt_state, loss = step(params, opt_state, self.x, self.y)
            losses.append(float(loss))
        return losses

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the parameters (``model.params()`` of the nnx forms)."""
        form, donate = donated_form(contender)
        if form in NNX_FORMS:
            from flax import nnx

            model = self.nnx_model(M.nnx_classes(), self.params0())
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_loss(model, x, y):
                return M.cross_entropy(model(x), y)

            step = nnx_step(nnx_loss)
            donated = nnx_donation(form) if donate else ()
            r = nnx_form(form, jit, step, model, optimizer, self.x, self.y, donate=donated)
            return r.project(lambda mo: mo[0].params())
        params = self.put(self.params0())
        opt_state = self.tx.init(params)
        if form in INPLACE:
            state = {"params": params, "opt_state": opt_state}
            fn = inplace_step(self.loss_fn, self.tx)
            r = inplace_form(form, jit, fn, state, self.x, self.y, donate=donate)
            return r.project(lambda st: st["params"])
        fn = functional_step(self.loss_fn, self.tx)
        donated = (0, 1) if donate else ()
        r = functional_runner(jit, fn, params, opt_state, self.x, self.y, donate=donated)
        return r.project(lambda po: po[0])


class MlpAdam(_ParamsWorkload):
    name = "mlp_adam"
    title = "3-layer MLP, Adam (dispatch-bound)"
    description = (
        "MLP 32->64->64->10 (ReLU, softmax cross-entropy), batch 32, optax Adam (lr 1e-3); "
        "6 parameter leaves, 13 more in Adam's state. Tiny: the time is mostly dispatch."
    )
    sizes = (32, 64, 64, 10)
    batch = 32

    def params0(self):
        return M.mlp_init(0, self.sizes)

    def loss_fn(self, params, x, y):
        return M.mlp_loss(params, x, y)

    def nnx_model(self, classes, params):
        return classes["MLP"](params)

    def data(self):
        return mlp_data(self.sizes, self.batch)


def mlp_data(sizes: tuple[int, ...], batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int32)
    return x, y


class TransformerAdam(_ParamsWorkload):
    name = "transformer_adam"
    title = "12-layer transformer, Adam"
    description = (
        "12 pre-LN transformer blocks (d_model 64, 4 heads, causal attention, GELU MLP 256), "
        "token + position embeddings, unembedding by the token embedding; batch 2 x 8 "
        "tokens, vocabulary 64, next-token cross-entropy, optax Adam (lr 1e-3). "
        "196 parameter leaves, 589 with Adam's state."
    )
    n_layers, d, heads, vocab, seq, batch = 12, 64, 4, 64, 8, 2
    tiny = {"n_layers": 2}

    def params0(self):
        return M.transformer_init(0, self.n_layers, self.d, self.vocab, self.seq)

    def loss_fn(self, params, x, y):
        return M.transformer_loss(params, x, y, self.heads)

    def nnx_model(self, classes, params):
        return classes["Transformer"](params, self.heads)

    def data(self):
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, self.vocab, (self.batch, self.seq)).astype(np.int32)
        labels = rng.integers(0, self.vocab, (self.batch, self.seq)).astype(np.int32)
        return tokens, labels


# --------------------------------------------------------------------------- tied embeddings


def tied_step(tx: Any) -> Callable[..., Any]:
    """The functional step of the tied model, aware of the tie by object identity.

    When ``params['unembed'] is params['embed']`` (the tie is visible in the function), the
    two uses form one parameter: its gradient is the sum over both places, it gets one
    update, and the result is put back in both places, so the tie survives the step. When
    they are two objects (as every leaf is under ``jax.jit``, which traces each position as
    its own input), each place is a parameter of its own and they drift apart.
    """
    import optax

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(M.tied_loss)(params, x, y)
        tied = params["unembed"] is params["embed"]
        if tied:
            g = grads["embed"] + grads["unembed"]
            grads = {**grads, "embed": g, "unembed": g}
        updates, opt_state = tx.update(grads, opt_state, params)
        new = optax.apply_updates(params, updates)
        if tied:
            new = {**new, "unembed": new["embed"]}
        return new, opt_state, loss

    return train_step


class TiedEmbeddings(Workload):
    name = "tied_embeddings"
    title = "tied embeddings (one array object in two places)"
    description = (
        "Embedding (vocabulary 256, d 64) -> tanh dense -> logits by the unembedding; "
        "params['embed'] and params['unembed'] are the same array object. Batch 64 tokens, "
        "next-token cross-entropy, Adam (lr 1e-2). The step is written against the tie: "
        "when the two entries are one object it sums their gradients and keeps them one "
        "object."
    )
    compared = (
        "Two semantics, each against its own plain-Python (un-jitted) run of the same step. "
        "*tied*: the un-jitted step on the tied parameters (the tie is one parameter, its "
        "gradient summed over both uses), expected of the contenders that keep shared "
        "objects shared: the treeclone policies whose identity axis is `preserve` (`alias`, "
        "`strict`) and `flax.nnx.jit` (the same `nnx.Param` in both places). *untied*: the "
        "un-jitted step on parameters whose two entries are separate copies, which is what "
        "`jax.jit` computes (it traces each position as its own input, so the tie is broken "
        "from the first step on); expected of `jax.jit`, `treeclone.jit[clone]` and "
        "`equinox.filter_jit`. Besides the losses, a contender passes only if its final "
        "`embed` and `unembed` are equal (tied) or differ (untied)."
    )
    lr = 1e-2
    vocab, d, batch = 256, 64, 64

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        rng = np.random.default_rng(1)
        self.x = self.put(rng.integers(0, self.vocab, self.batch).astype(np.int32))
        self.y = self.put(rng.integers(0, self.vocab, self.batch).astype(np.int32))

    def params0(self, tied: bool = True) -> dict[str, Any]:
        p = M.tied_init(0, self.vocab, self.d)
        embed = self.put(p["embed"])
        # device_put maps over leaves, which would untie the two entries: put E once.
        unembed = embed if tied else self.put(p["unembed"].copy())
        return {"embed": embed, "hidden": self.put(p["hidden"]), "unembed": unembed}

    def semantics(self, contender: str) -> str:
        return TIED if contender in self.preserving else UNTIED

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step = tied_step(self.tx)
        params = self.params0(tied=semantics == TIED)
        opt_state = self.tx.init(params)
        losses = []
        for _ in range(n):
            params, opt_state, loss = step(params, opt_state, self.x, self.y)
            losses.append(float(loss))
        if semantics == TIED:
            assert params["unembed"] is params["embed"], "reference lost its tie"
        return losses

    @staticmethod
    def _tie_check(
        semantics: str, notes: list[str], get: Callable[[], tuple[Any, Any, bool, str]]
    ) -> Callable[[], Any]:
        def verify() -> str | None:
            embed, unembed, same, what = get()
            notes.append(f"after the check steps, `{what}`: {same}")
            equal = np.array_equal(np.asarray(embed), np.asarray(unembed))
            if semantics == TIED and not equal:
                return "embed and unembed differ after training: the tie was not kept"
            if semantics == UNTIED and equal:
                return "embed and unembed are still equal: expected the tie to be broken"
            return None

        return verify

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        sem = self.semantics(contender)
        if contender == FLOOR:
            raise NotApplicable("a flat list of arrays cannot hold the tie (one object twice)")
        if contender in NNX_FORMS:
            from flax import nnx

            model = M.nnx_classes()["Tied"](M.tied_init(0, self.vocab, self.d))
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_loss(model, x, y):
                return M.cross_entropy(model(x), y)

            step = nnx_step(nnx_loss)
            r = nnx_form(contender, jit, step, model, optimizer, self.x, self.y)
            r.project(lambda mo: mo[0].params())
            r.semantics = sem
            r.verify = self._tie_check(
                sem,
                r.notes,
                lambda: (
                    model.embed[...],
                    model.unembed[...],
                    model.unembed is model.embed,
                    "model.unembed is model.embed",
                ),
            )
            return r
        params = self.params0(tied=True)
        opt_state = self.tx.init(params)
        fn = tied_step(self.tx)
        if contender in INPLACE:
            state = {"params": params, "opt_state": opt_state}

            def inplace(state, x, y):
                new, state["opt_state"], loss = fn(state["params"], state["opt_state"], x, y)
                state["params"] = new
                return loss

            r = inplace_form(contender, jit, inplace, state, self.x, self.y, semantics=sem)
            r.project(lambda st: st["params"])
            get = lambda: state["params"]  # noqa: E731
        else:
            r = functional_runner(jit, fn, params, opt_state, self.x, self.y, semantics=sem)
            r.project(lambda po: po[0])
            get = lambda: r.run(0)[1][0]  # noqa: E731  (run(0): the current state, no step)

        def tie() -> tuple[Any, Any, bool, str]:
            p = get()
            return p["embed"], p["unembed"], p["unembed"] is p["embed"], "unembed is embed"

        r.verify = self._tie_check(sem, r.notes, tie)
        return r


# --------------------------------------------------------------------------- frozen half


def merge_halves(frozen: dict[str, Any], trainable: dict[str, Any]) -> dict[str, Any]:
    return {
        "embed": frozen["embed"],
        "layers": list(frozen["layers"]) + list(trainable["layers"]),
        "final_ln": trainable["final_ln"],
    }


class FrozenHalf(Workload):
    name = "frozen_half"
    title = "fine-tuning with half the parameters frozen"
    description = (
        "The transformer of transformer_adam with 8 layers; the embeddings and the first 4 "
        "layers are frozen (66 leaves), the last 4 layers and the final layer norm are "
        "trained with Adam (lr 1e-3; 66 leaves, 133 in Adam's state). The functional step "
        "takes and returns the frozen half unchanged (pass-through leaves)."
    )
    compared = (
        "Each contender's losses over the check steps against a plain-Python (un-jitted) run "
        "of the functional step. `treeclone.jit[alias]` leaves the frozen half alone (neither "
        "mutated nor returned); `flax.nnx.jit` holds it in a non-`Param` variable type that "
        "`nnx.value_and_grad` and `nnx.Optimizer` do not touch."
    )
    n_layers, n_frozen = 8, 4
    d, heads, vocab, seq, batch = 64, 4, 64, 8, 2
    tiny = {"n_layers": 2, "n_frozen": 1}

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        rng = np.random.default_rng(1)
        shape = (self.batch, self.seq)
        self.x = self.put(rng.integers(0, self.vocab, shape).astype(np.int32))
        self.y = self.put(rng.integers(0, self.vocab, shape).astype(np.int32))

    def full_params(self) -> dict[str, Any]:
        return M.transformer_init(0, self.n_layers, self.d, self.vocab, self.seq)

    def halves(self) -> tuple[dict[str, Any], dict[str, Any]]:
        p = self.put(self.full_params())
        k = self.n_frozen
        frozen = {"embed": p["embed"], "layers": p["layers"][:k]}
        trainable = {"layers": p["layers"][k:], "final_ln": p["final_ln"]}
        return frozen, trainable

    def functional(self) -> Callable[..., Any]:
        import optax

        tx, heads = self.tx, self.heads

        def train_step(frozen, trainable, opt_state, x, y):
            def loss_fn(trainable):
                return M.transformer_loss(merge_halves(frozen, trainable), x, y, heads)

            loss, grads = jax.value_and_grad(loss_fn)(trainable)
            updates, opt_state = tx.update(grads, opt_state, trainable)
            return frozen, optax.apply_updates(trainable, updates), opt_state, loss

        return train_step

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step = self.functional()
        frozen, trainable = self.halves()
        opt_state = self.tx.init(trainable)
        losses = []
        for _ in range(n):
            frozen, trainable, opt_state, loss = step(frozen, trainable, opt_state, self.x, self.y)
            losses.append(float(loss))
        return losses

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the parameters, frozen and trained (``model.params()`` of the nnx
        forms). Donated, every form donates the trained half and Adam's state only: the
        in-place step takes the frozen half as an argument of its own (donating it would
        delete the arrays the step leaves alone, as ``jax.jit`` deletes them)."""
        x, y = self.x, self.y
        form, donate = donated_form(contender)
        if form in NNX_FORMS:
            from flax import nnx

            classes = M.nnx_classes()
            model = classes["Transformer"](self.full_params(), self.heads, self.n_frozen)
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_loss(model, x, y):
                return M.cross_entropy(model(x), y)

            donated = nnx_donation(form) if donate else ()
            r = nnx_form(form, jit, nnx_step(nnx_loss), model, optimizer, x, y, donate=donated)
            return r.project(lambda mo: mo[0].params())
        frozen, trainable = self.halves()
        opt_state = self.tx.init(trainable)
        step = self.functional()
        if form in INPLACE and donate and form != FLOOR:
            state = {"trainable": trainable, "opt_state": opt_state}

            def apart(frozen, state, x, y):
                _, state["trainable"], state["opt_state"], loss = step(
                    frozen, state["trainable"], state["opt_state"], x, y
                )
                return loss

            runner = partial_runner if form == TC_PARTIAL else inplace_runner
            r = runner(jit, apart, state, x, y, bound=(frozen,), donate=(1,))
            return r.project(lambda st: merge_halves(frozen, st["trainable"]))
        if form in INPLACE:
            state = {"frozen": frozen, "trainable": trainable, "opt_state": opt_state}

            def inplace(state, x, y):
                _, state["trainable"], state["opt_state"], loss = step(
                    state["frozen"], state["trainable"], state["opt_state"], x, y
                )
                return loss

            r = inplace_form(form, jit, inplace, state, x, y, donate=donate)
            return r.project(lambda st: merge_halves(st["frozen"], st["trainable"]))
        traces = TraceCounter()
        f = _jit(jit, traces.wrap(step), donate=(1, 2) if donate else ())
        fz, tr, o = frozen, trainable, opt_state

        def run(n: int):
            nonlocal fz, tr, o
            a, b, c, loss = fz, tr, o, None
            for _ in range(n):
                a, b, c, loss = f(a, b, c, x, y)
            fz, tr, o = a, b, c
            return loss, (a, b, c)

        return Runner(run=run, traces=traces, state=lambda: merge_halves(fz, tr))


# --------------------------------------------------------------------------- seed pattern


@dataclasses.dataclass
class Optimizer:
    """An optax optimizer as a mutable pytree node: ``update`` changes it in place.

    The pattern of the seed discussion: ``params = optimizer.update(grads, params)`` inside
    a jitted ``train_step`` that returns the optimizer.
    """

    tx: Any
    opt_state: Any
    count: Any

    def update(self, grads: Any, params: Any) -> Any:
        import optax

        updates, self.opt_state = self.tx.update(grads, self.opt_state, params)
        self.count = self.count + 1
        return optax.apply_updates(params, updates)


jax.tree_util.register_dataclass(Optimizer, data_fields=["opt_state", "count"], meta_fields=["tx"])


def seed_train_step(model, x, y, optimizer):
    loss, grads = jax.value_and_grad(M.mlp_loss)(model, x, y)
    model = optimizer.update(grads, model)
    return model, loss, optimizer


class SeedPattern(Workload):
    name = "seed_pattern"
    title = "the seed pattern: an optimizer mutated in place and returned"
    description = (
        "`train_step(model, x, y, optimizer)` on the MLP of mlp_adam: `optimizer` is a "
        "dataclass registered with `jax.tree_util.register_dataclass` (optax Adam state and "
        "a step count), mutated in place by `optimizer.update(grads, model)` and returned "
        "with the model and the loss. The same function runs under every jit wrapper; "
        "flax.nnx.jit runs the nnx version (`nnx.Optimizer.update`, in place, loss returned)."
    )
    compared = (
        "Each contender's losses over the check steps against a plain-Python (un-jitted) run "
        "of the same `train_step` (where the mutation hits the caller's optimizer). The "
        "notes say whether the optimizer a call returns is the object that was passed in."
    )
    sizes, batch = MlpAdam.sizes, MlpAdam.batch

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        self.x, self.y = (self.put(a) for a in mlp_data(self.sizes, self.batch))

    def fresh(self) -> tuple[Any, Optimizer]:
        model = self.put(M.mlp_init(0, self.sizes))
        count = self.put(np.zeros((), np.int32))
        return model, Optimizer(self.tx, self.tx.init(model), count)

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        model, optimizer = self.fresh()
        losses = []
        for _ in range(n):
            model, loss, optimizer = seed_train_step(model, self.x, self.y, optimizer)
            losses.append(float(loss))
        assert int(optimizer.count) == n
        return losses

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        x, y = self.x, self.y
        if contender in (FLOOR, TC_PARTIAL, NNX_PARTIAL):
            raise NotApplicable(
                "the seed's step is called as step(model, x, y, optimizer) and returns the "
                "optimizer: the pattern under test, not a state to bind or flatten"
            )
        if contender in (NNX, NNX_TREE):
            from flax import nnx

            model = M.nnx_classes()["MLP"](M.mlp_init(0, self.sizes))
            optimizer = nnx.Optimizer(model, self.tx, wrt=nnx.Param)

            def nnx_train_step(model, x, y, optimizer):
                def loss_fn(model):
                    return M.cross_entropy(model(x), y)

                loss, grads = nnx.value_and_grad(loss_fn)(model)
                optimizer.update(model, grads)
                return loss

            traces = TraceCounter()
            f = jit(traces.wrap(nnx_train_step))

            def run_nnx(n: int):
                loss = None
                for _ in range(n):
                    loss = f(model, x, y, optimizer)
                return loss, (model, optimizer)

            return Runner(
                run=run_nnx,
                traces=traces,
                arrays=nnx_arrays(model, optimizer),
                state=model.params,
            )

        model, optimizer = self.fresh()
        traces = TraceCounter()
        f = jit(traces.wrap(seed_train_step))
        passed = optimizer
        state = {"model": model, "optimizer": optimizer, "first": True}
        notes: list[str] = []

        def run(n: int):
            m, o, loss = state["model"], state["optimizer"], None
            for _ in range(n):
                m, loss, o = f(m, x, y, o)
            if n and state["first"]:
                state["first"] = False
                same = o is passed
                count = int(np.asarray(passed.count))
                notes.append(
                    "the optimizer returned by the first call "
                    + ("is the object passed in" if same else "is a new object")
                    + f"; the passed object's count after it: {count}"
                )
            state["model"], state["optimizer"] = m, o
            return loss, (m, o)

        return Runner(run=run, traces=traces, notes=notes, state=lambda: state["model"])


# --------------------------------------------------------------------------- equinox


class EqxMlpAdam(Workload):
    name = "eqx_mlp_adam"
    group = EQUINOX
    title = "an equinox MLP with a function field, Adam"
    description = (
        "The MLP of mlp_adam (32->64->64->10, batch 32, optax Adam lr 1e-3) as an equinox "
        "Module whose activation (`jax.nn.relu`) is a field: a leaf that is not an array. "
        "`equinox.filter_jit` and `treeclone.jit[clone,traced=arrays]` run the functional "
        "step `(model, opt_state, x, y) -> (model, opt_state, loss)` "
        "(`eqx.filter_value_and_grad`, `eqx.apply_updates`); "
        "`treeclone.jit[alias,traced=arrays]` and `treeclone.jit_partial[alias,traced=arrays]` "
        "(the state bound) an in-place step that assigns the new model and optimizer state "
        "into a `{'model', 'opt_state'}` dict; `jax.jit` (functional), the floor and "
        "`treeclone.jit[alias,partitioned]` (in place) the same step over "
        "`eqx.partition(model, eqx.is_array)`'s arrays, the rest (the activation) closed over "
        "and combined inside."
    )
    compared = (
        "Each contender's losses over the check steps against a plain-Python (un-jitted) run "
        "of the functional step, and its final arrays (the model's and Adam's state) against "
        "`jax.jit`'s."
    )
    sizes, batch = MlpAdam.sizes, MlpAdam.batch

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        super().__init__(device, preserving)
        self.x, self.y = (self.put(a) for a in mlp_data(self.sizes, self.batch))

    def fresh(self) -> tuple[Any, Any]:
        import equinox as eqx

        p = self.put(M.mlp_init(0, self.sizes))
        layers = tuple(p[f"layer{i}"] for i in range(len(p)))
        model = M.eqx_mlp_class()(layers, jax.nn.relu)
        return model, self.tx.init(eqx.filter(model, eqx.is_array))

    def step(self) -> Callable[..., Any]:
        import equinox as eqx

        tx = self.tx

        def loss_fn(model, x, y):
            return M.cross_entropy(model(x), y)

        def train_step(model, opt_state, x, y):
            loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
            updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), opt_state, loss

        return train_step

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step, (model, opt_state) = self.step(), self.fresh()
        losses = []
        for _ in range(n):
            model, opt_state, loss = step(model, opt_state, self.x, self.y)
            losses.append(float(loss))
        return losses

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the model's arrays (``eqx.filter(model, eqx.is_array)``) and Adam's
        state."""
        import equinox as eqx

        step, (model, opt_state) = self.step(), self.fresh()
        x, y = self.x, self.y

        def arrays(model: Any) -> Any:
            return eqx.filter(model, eqx.is_array)

        if contender in (EQX, TC_CLONE_TRACED):
            r = functional_runner(jit, step, model, opt_state, x, y)
            return r.project(lambda mo: (arrays(mo[0]), mo[1]))
        if contender in (TC_ALIAS_TRACED, TC_PARTIAL_TRACED):
            state = {"model": model, "opt_state": opt_state}

            def inplace(state, x, y):
                state["model"], state["opt_state"], loss = step(
                    state["model"], state["opt_state"], x, y
                )
                return loss

            form = TC_PARTIAL if contender == TC_PARTIAL_TRACED else TC_ALIAS
            r = inplace_form(form, jit, inplace, state, x, y)
            return r.project(lambda st: (arrays(st["model"]), st["opt_state"]))
        if contender not in (BASELINE, FLOOR, TC_ALIAS_PARTITIONED):
            raise NotApplicable(f"{contender} is not one of this workload's forms")
        params, static = eqx.partition(model, eqx.is_array)

        def on_arrays(params, opt_state, x, y):
            model, opt_state, loss = step(eqx.combine(params, static), opt_state, x, y)
            return arrays(model), opt_state, loss

        if contender == BASELINE:
            return functional_runner(jit, on_arrays, params, opt_state, x, y)
        state = {"params": params, "opt_state": opt_state}

        def inplace_arrays(state, x, y):
            state["params"], state["opt_state"], loss = on_arrays(
                state["params"], state["opt_state"], x, y
            )
            return loss

        form = FLOOR if contender == FLOOR else TC_ALIAS
        r = inplace_form(form, jit, inplace_arrays, state, x, y)
        return r.project(lambda st: (st["params"], st["opt_state"]))


# --------------------------------------------------------------------------- nnx overhead


@functools.cache
def overhead_model_class() -> type:
    """flax's overhead benchmark model (``benchmarks/nnx_graph_overhead.py`` in google/flax),
    written afresh: ``depth`` Blocks of a Linear (``w``, ``b``) and a BatchNorm, and a
    ``Count`` Variable incremented at every call."""
    import jax.numpy as jnp
    from flax import nnx

    class Linear(nnx.Module):
        def __init__(self, din: int, dout: int, rngs: Any):
            self.w = nnx.Param(jax.random.uniform(rngs.params(), (din, dout)))
            self.b = nnx.Param(jnp.zeros((dout,)))

        def __call__(self, x):
            return x @ self.w[...] + self.b[...]

    class Block(nnx.Module):
        def __init__(self, din: int, dout: int, rngs: Any):
            self.linear = Linear(din, dout, rngs)
            self.bn = nnx.BatchNorm(dout, rngs=rngs)

        def __call__(self, x):
            return nnx.relu(self.bn(self.linear(x)))

    class Count(nnx.Variable):
        pass

    class OverheadMLP(nnx.Module):
        def __init__(self, width: int, depth: int, rngs: Any):
            self.count = Count(jnp.array(0))
            self.linear_in = Block(1, width, rngs)
            self.intermediates = nnx.List([Block(width, width, rngs) for _ in range(depth - 2)])
            self.linear_out = Block(width, 1, rngs)

        def __call__(self, x):
            self.count[...] += 1
            x = nnx.relu(self.linear_in(x))
            for layer in self.intermediates:
                x = nnx.relu(layer(x))
            return self.linear_out(x)

    return OverheadMLP


class NnxOverhead(Workload):
    """flax's own overhead benchmark: what each wrapper costs around an nnx model's step."""

    body = "train"
    depth = 20
    width = 32
    lr = 1e-3
    tiny = {"depth": 3}
    compared = (
        "Each contender's losses over the check steps against eager nnx (no jit) on the "
        "same model; an empty step's loss is 0. Forms: `jax.jit`, `treeclone.jit[clone]` "
        "and `treeclone.jit[strict]` run flax's own functional form (`nnx.split` state in, "
        "`nnx.merge` inside, new state out); `treeclone.jit[alias]` and the nnx wrappers "
        "call `step(model, optimizer, x, y)`, which updates them in place; the jit_partial "
        "contenders bind model and optimizer; `floor` is one jax.jit over the flat arrays."
    )

    def __init__(self, device: Any, preserving: frozenset[str] = frozenset()) -> None:
        import optax

        super().__init__(device, preserving)
        self.tx = optax.sgd(self.lr)
        rng = np.random.default_rng(0)
        x = np.linspace(0, 1, 100, dtype=np.float32)[:, None]
        y = (0.8 * x**2 + 0.1 + rng.normal(0, 0.1, x.shape)).astype(np.float32)
        self.x, self.y = self.put(x), self.put(y)

    def fresh(self) -> tuple[Any, Any]:
        from flax import nnx

        model = overhead_model_class()(self.width, self.depth, nnx.Rngs(0))
        return model, nnx.Optimizer(model, self.tx, wrt=nnx.Param)

    def step(self) -> Callable[..., Any]:
        """``step(model, optimizer, x, y)``: updates both in place; returns the loss (None for
        the empty body, flax's measure of pure call overhead)."""
        import jax.numpy as jnp
        from flax import nnx

        if self.body == "empty":
            return lambda model, optimizer, x, y: None

        def train_step(model, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
            optimizer.update(model, grads)
            return loss

        return train_step

    def reference_losses(self, semantics: str, n: int) -> list[float]:
        step, (model, optimizer) = self.step(), self.fresh()
        return [_loss(step(model, optimizer, self.x, self.y)) for _ in range(n)]

    def runner(self, contender: str, jit: Callable[..., Any]) -> Runner:
        """``state()``: the nnx state of ``(model, optimizer)`` (every Variable). Donated: the
        model and the optimizer (``nnx.split``'s state in the functional form)."""
        from flax import nnx

        form, donate = donated_form(contender)
        if form == EQX:
            raise NotApplicable("equinox.filter_jit is not a way to run flax nnx modules")
        step, (model, optimizer) = self.step(), self.fresh()
        x, y = self.x, self.y
        donated = nnx_donation(form) if donate else ()
        if form in (TC_ALIAS, NNX, NNX_TREE):
            r = nnx_runner(jit, step, model, optimizer, x, y, donate=donated)
            r.project(nnx.state)
        elif form in (TC_PARTIAL, NNX_PARTIAL):
            r = nnx_form(NNX_PARTIAL, jit, step, model, optimizer, x, y, donate=donated)
            r.project(nnx.state)
        else:
            graphdef, state = nnx.split((model, optimizer))

            def on_state(state, x, y):
                m, o = nnx.merge(graphdef, state)
                loss = step(m, o, x, y)
                return loss, nnx.split((m, o))[1]

            if form == FLOOR:
                r = floor_runner(jit, on_state, state, x, y, donate=donate)
            else:  # jax.jit, treeclone clone and strict: flax's functional form
                r = functional_runner(
                    jit,
                    lambda g, st, x, y: (g, *on_state(st, x, y)[::-1]),
                    graphdef,
                    state,
                    x,
                    y,
                    arrays=state_arrays,
                    donate=(1,) if donate else (),
                )
                r.project(lambda gs: gs[1])
        run = r.run
        r.run = lambda n: (lambda out: (_loss(out[0]), out[1]))(run(n))
        return r


def _loss(loss: Any) -> Any:
    return 0.0 if loss is None else loss


def _overhead(body: str, depth: int) -> type[NnxOverhead]:
    what = {
        "empty": "an empty step: the wrapper's own cost per call (flax's measure)",
        "train": "a training step: forward, `nnx.value_and_grad`, `optimizer.update` (SGD)",
    }[body]
    attrs = {
        "name": f"nnx_{body}_{depth}",
        "title": f"flax's overhead model, depth {depth}, {body} step",
        "description": (
            f"The model of flax's `benchmarks/nnx_graph_overhead.py`: {depth} Blocks "
            "(`Linear` + `nnx.BatchNorm`, width 32) and a `Count` Variable incremented at "
            f"every call, with `nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)`; {what}."
        ),
        "body": body,
        "depth": depth,
    }
    return type(f"Nnx{body.title()}{depth}", (NnxOverhead,), attrs)


def _donated(base: type[Workload]) -> type[Workload]:
    """``base`` under the donated group's contenders (``contenders.DONATED``): the same step,
    each contender donating the state it replaces (the runners read ``donated_form``)."""
    attrs = {"name": f"{base.name}_donated", "title": f"{base.title}, donated", "group": DONATED}
    return type(f"{base.__name__}Donated", (base,), attrs)


_OVERHEAD = {
    (body, depth): _overhead(body, depth) for depth in (20, 100) for body in ("empty", "train")
}
WORKLOADS: dict[str, type[Workload]] = {
    w.name: w
    for w in (
        MlpAdam,
        TransformerAdam,
        TiedEmbeddings,
        FrozenHalf,
        SeedPattern,
        *_OVERHEAD.values(),
        *(_donated(w) for w in (MlpAdam, _OVERHEAD["train", 20], FrozenHalf, TransformerAdam)),
        EqxMlpAdam,
    )
}


def tiny(workload: type[Workload]) -> type[Workload]:
    """``workload`` at its ``tiny`` sizes (a --tiny run): the same steps, smaller."""
    if not workload.tiny:
        return workload
    return type(workload.__name__, (workload,), dict(workload.tiny))
