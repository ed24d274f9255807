"""The contenders: which jit wrappers are compared, and whether each one can be imported here.

Every workload is run under each of these. A contender whose library cannot be imported is
reported as skipped with the reason; it is never silently dropped.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BASELINE = "jax.jit"
FLOOR = "floor"
TC_CLONE = "treeclone.jit[clone]"
TC_ALIAS = "treeclone.jit[alias]"
TC_STRICT = "treeclone.jit[strict]"
TC_PARTIAL = "treeclone.jit_partial[alias]"
NNX = "flax.nnx.jit"
NNX_TREE = "flax.nnx.jit[graph=False]"
NNX_PARTIAL = "flax.nnx.jit_partial"
EQX = "equinox.filter_jit"

CONTENDERS = (
    BASELINE,
    FLOOR,
    TC_CLONE,
    TC_ALIAS,
    TC_STRICT,
    TC_PARTIAL,
    NNX,
    NNX_TREE,
    NNX_PARTIAL,
    EQX,
)
TC_POLICY = {TC_CLONE: "clone", TC_ALIAS: "alias", TC_STRICT: "strict", TC_PARTIAL: "alias"}
# The other libraries' wrappers, each in its fastest documented modes: the "fastest peer" of a
# workload is the fastest of these there. (FLOOR is a reference, not a peer: see FLOOR_IS.)
PEERS = (BASELINE, NNX, NNX_TREE, NNX_PARTIAL, EQX)
# How many calls the floor's loop keeps each call's arrays after it, per platform
# (workloads.floor_runner): the fastest hold measured there by benches/floor_probe.py. On a TPU
# v5e mlp_adam's floor took 457 µs a step letting go of them at once, 416 keeping them one
# call, 372 three (nnx_train_20: 1,752, 1,149 and 1,169). On the CPU holding costs: three
# calls took transformer_adam's floor from 10,920 to 11,368 µs and frozen_half's from 3,759
# to 4,005, beyond both spreads, and left mlp_adam and nnx_train_20 level.
FLOOR_HOLD = {"tpu": 3}


def floor_hold(platform: str) -> int:
    """How many calls the floor keeps each call's arrays on ``platform`` (0: none)."""
    return FLOOR_HOLD.get(platform, 0)


# What the floor does, in the words of the reports (the one place that says it).
FLOOR_IS = (
    "`floor` is one `jax.jit` of the state's arrays, each its own argument, that returns the "
    "arrays the step replaces and the loss as one flat tuple (the state is unflattened and "
    "flattened at trace time only), in a loop that donates nothing and keeps each call's "
    "arrays "
    + ", ".join(f"{n} calls longer on a {p.upper()}" for p, n in FLOOR_HOLD.items())
    + " and not at all elsewhere (the fastest on the TPU and the CPU, "
    "`benches/floor_probe.py`): the least a wrapper that donates nothing can do, so every "
    "contender's ratio to it is its own overhead."
)


@dataclass
class Availability:
    """For each contender: the jit wrapper to use, or why it is skipped."""

    wrappers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    # Contenders under which an object in two places of the inputs is still one object
    # inside the function (treeclone policies with identity "preserve"; nnx's graph mode).
    preserving: frozenset[str] = frozenset()


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= 200 else text[:197] + "..."


def probe() -> Availability:
    """Import every contender's library; record its jit wrapper or the reason it is skipped."""
    import jax

    av = Availability()
    av.wrappers[BASELINE] = jax.jit
    av.wrappers[FLOOR] = jax.jit  # the workloads build the flat-array step around it
    try:
        tc_jit = importlib.import_module("treeclone").jit
        if not callable(tc_jit):
            raise TypeError(f"treeclone.jit is not callable: {tc_jit!r}")
    except ModuleNotFoundError as e:
        if e.name == "treeclone":
            for name in TC_POLICY:
                av.skipped[name] = "not installed"
        else:
            for name in TC_POLICY:
                av.skipped[name] = f"treeclone.jit not available: {_short(e)}"
    except Exception as e:  # an ImportError, AttributeError, ... of a half-written package
        for name in TC_POLICY:
            av.skipped[name] = f"treeclone.jit not available: {_short(e)}"
    else:
        for name, policy in TC_POLICY.items():
            if name == TC_PARTIAL:
                partial = getattr(importlib.import_module("treeclone"), "jit_partial", None)
                if partial is None:
                    av.skipped[name] = "this treeclone has no jit_partial"
                    continue
                av.wrappers[name] = functools.partial(partial, policy=policy)
            else:
                av.wrappers[name] = _with_policy(tc_jit, policy)
            if _preserves_identity(policy):
                av.preserving |= {name}
    try:
        from flax import nnx
    except ImportError:
        for name in (NNX, NNX_TREE, NNX_PARTIAL):
            av.skipped[name] = "not installed"
    else:
        av.wrappers[NNX] = nnx.jit
        av.preserving |= {NNX}
        # Tree mode and jit_partial refuse shared Variables (they do not preserve identity).
        av.wrappers[NNX_TREE] = functools.partial(nnx.jit, graph=False)
        if hasattr(nnx, "jit_partial"):
            av.wrappers[NNX_PARTIAL] = functools.partial(nnx.jit_partial, graph=False)
        else:
            av.skipped[NNX_PARTIAL] = "this flax has no nnx.jit_partial"
    try:
        import equinox as eqx
    except ImportError:
        av.skipped[EQX] = "not installed"
    else:
        av.wrappers[EQX] = eqx.filter_jit
    return av


def _preserves_identity(policy: str) -> bool:
    """Whether a treeclone preset keeps shared objects shared (its identity axis)."""
    try:
        policies = importlib.import_module("treeclone.policies")
        return policies.as_policy(policy).identity == "preserve"
    except Exception:
        return policy == "alias"


def is_policy_rejection(e: BaseException) -> bool:
    """True if ``e`` is treeclone refusing a call on purpose (``strict``'s MutationError)."""
    try:
        error = importlib.import_module("treeclone.policies").MutationError
    except Exception:
        return type(e).__name__ == "MutationError"
    return isinstance(e, error)


def _with_policy(tc_jit: Callable[..., Any], policy: str) -> Callable[..., Any]:
    def wrap(fun: Callable[..., Any], **kwargs: Any) -> Any:
        return tc_jit(fun, policy=policy, **kwargs)

    wrap.__name__ = f"treeclone.jit[{policy}]"
    return wrap


def describe_error(e: BaseException) -> str:
    return _short(e)
