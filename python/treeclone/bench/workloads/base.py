"""What every workload and the harness share: the ``Workload`` base class, the ``Runner`` a
workload builds per contender, the trace counter, and the names of the semantics a contender
is checked against."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax

from ..contenders import FLOOR, NNX, NNX_PARTIAL, NNX_TREE, TC_ALIAS, TC_PARTIAL, TRAINING, Group

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


# How most workloads check a contender, the start of their ``compared``.
AGAINST_UNJITTED = (
    "Each contender's losses over the check steps against a plain-Python (un-jitted) run "
)


class Workload:
    """Base class: data, initial parameters, reference run and per-contender runners."""

    name = ""
    title = ""
    description = ""
    group: Group = TRAINING
    # The class attributes a --tiny run (CI's smoke test) sets: the smallest sizes that run
    # the same code paths.
    tiny: dict[str, Any] = {}
    compared = AGAINST_UNJITTED + "of the functional step from the same initial parameters."
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
