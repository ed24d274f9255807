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

The package's modules: ``base`` (``Workload``, ``Runner``), ``runners`` (the step forms and
their loops, the floor's), and one module per family of workloads: ``params`` (``mlp_adam``,
``transformer_adam``), ``tied``, ``frozen``, ``seed``, ``eqx_mlp`` and ``nnx_overhead``. This
module registers them all (``WORKLOADS``) and re-exports what the harness and ``benches/``
import from it.
"""

from __future__ import annotations

from ..contenders import DONATED
from .base import (
    INPLACE,
    NNX_FORMS,
    STANDARD,
    TIED,
    UNTIED,
    NotApplicable,
    Runner,
    TraceCounter,
    Workload,
)
from .eqx_mlp import EqxMlpAdam
from .frozen import FrozenHalf, merge_halves
from .nnx_overhead import NnxOverhead, overhead_model_class, overhead_workload
from .params import MlpAdam, ParamsWorkload, TransformerAdam, mlp_data
from .runners import (
    floor_runner,
    functional_runner,
    functional_step,
    inplace_form,
    inplace_runner,
    inplace_step,
    jitted,
    nnx_arrays,
    nnx_donation,
    nnx_form,
    nnx_runner,
    nnx_step,
    partial_runner,
    state_arrays,
)
from .seed import Optimizer, SeedPattern, seed_train_step
from .tied import TiedEmbeddings, tied_step

__all__ = [
    "EqxMlpAdam",
    "FrozenHalf",
    "INPLACE",
    "MlpAdam",
    "NNX_FORMS",
    "NnxOverhead",
    "NotApplicable",
    "Optimizer",
    "ParamsWorkload",
    "Runner",
    "STANDARD",
    "SeedPattern",
    "TIED",
    "TiedEmbeddings",
    "TraceCounter",
    "TransformerAdam",
    "UNTIED",
    "WORKLOADS",
    "Workload",
    "floor_runner",
    "functional_runner",
    "functional_step",
    "inplace_form",
    "inplace_runner",
    "inplace_step",
    "jitted",
    "merge_halves",
    "mlp_data",
    "nnx_arrays",
    "nnx_donation",
    "nnx_form",
    "nnx_runner",
    "nnx_step",
    "overhead_model_class",
    "overhead_workload",
    "partial_runner",
    "seed_train_step",
    "state_arrays",
    "tied_step",
    "tiny",
]


def _donated(base: type[Workload]) -> type[Workload]:
    """``base`` under the donated group's contenders (``contenders.DONATED``): the same step,
    each contender donating the state it replaces (the runners read ``donated_form``)."""
    attrs = {"name": f"{base.name}_donated", "title": f"{base.title}, donated", "group": DONATED}
    return type(f"{base.__name__}Donated", (base,), attrs)


_OVERHEAD = {
    (body, depth): overhead_workload(body, depth)
    for depth in (20, 100)
    for body in ("empty", "train")
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
