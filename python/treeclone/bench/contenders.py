"""The contenders: which jit wrappers are compared, and whether each one can be imported here.

Every workload is run under each of these. A contender whose library cannot be imported is
reported as skipped with the reason; it is never silently dropped.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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

# The donated variants (group "donated"): each contender donates the state its step replaces
# (``donate_argnums``), in the form of the contender without donation named in DONATED_FORM.
BASELINE_DON = "jax.jit[donate]"
FLOOR_DON = "floor[donate]"
TC_ALIAS_DON = "treeclone.jit[alias,donate]"
TC_STRICT_DON = "treeclone.jit[strict,donate]"
TC_PARTIAL_DON = "treeclone.jit_partial[alias,donate]"
NNX_DON = "flax.nnx.jit[donate]"
NNX_TREE_DON = "flax.nnx.jit[graph=False,donate]"
NNX_PARTIAL_DON = "flax.nnx.jit_partial[donate]"
DONATED_FORM = {
    BASELINE_DON: BASELINE,
    FLOOR_DON: FLOOR,
    TC_ALIAS_DON: TC_ALIAS,
    TC_STRICT_DON: TC_STRICT,
    TC_PARTIAL_DON: TC_PARTIAL,
    NNX_DON: NNX,
    NNX_TREE_DON: NNX_TREE,
    NNX_PARTIAL_DON: NNX_PARTIAL,
}

# The equinox workload (group "equinox"): an equinox Module with a function field, which
# ``jax.jit`` cannot take whole, under treeclone's ``traced="arrays"`` (equinox's rule).
# ``jax.jit`` and the floor run over ``eqx.partition``'s arrays, the static rest closed over;
# so does ``treeclone.jit[alias,partitioned]``: alias on the same math's all-array state.
TC_CLONE_TRACED = "treeclone.jit[clone,traced=arrays]"
TC_ALIAS_TRACED = "treeclone.jit[alias,traced=arrays]"
TC_PARTIAL_TRACED = "treeclone.jit_partial[alias,traced=arrays]"
TC_ALIAS_PARTITIONED = "treeclone.jit[alias,partitioned]"

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
# Every treeclone contender: (jit or jit_partial, its policy, its fixed options).
TC_SPECS: dict[str, tuple[str, str, dict[str, Any]]] = {
    TC_CLONE: ("jit", "clone", {}),
    TC_ALIAS: ("jit", "alias", {}),
    TC_STRICT: ("jit", "strict", {}),
    TC_PARTIAL: ("jit_partial", "alias", {}),
    TC_ALIAS_DON: ("jit", "alias", {}),
    TC_STRICT_DON: ("jit", "strict", {}),
    TC_PARTIAL_DON: ("jit_partial", "alias", {}),
    TC_CLONE_TRACED: ("jit", "clone", {"traced": "arrays"}),
    TC_ALIAS_TRACED: ("jit", "alias", {"traced": "arrays"}),
    TC_PARTIAL_TRACED: ("jit_partial", "alias", {"traced": "arrays"}),
    TC_ALIAS_PARTITIONED: ("jit", "alias", {}),
}
TC_POLICY = {name: policy for name, (_, policy, _) in TC_SPECS.items()}
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

FLOOR_DON_IS = (
    "`floor[donate]` is the floor with donation: the same flat `jax.jit` of the state's "
    "arrays, with `donate_argnums` naming the arrays the step replaces (found at a trace "
    "ahead), in a loop that holds nothing (a donated array is gone after the call): the "
    "least a wrapper that donates can do."
)
# Each floor's description, for the reports.
FLOOR_DESCRIPTIONS = {FLOOR: FLOOR_IS, FLOOR_DON: FLOOR_DON_IS}


@dataclass(frozen=True)
class Group:
    """A set of workloads timed under the same contenders, reported in one headline table and
    one generated section of the docs (``section``, one per platform)."""

    name: str
    title: str
    about: str  # what the group measures, for the reports
    contenders: tuple[str, ...]
    baseline: str  # the "vs jax.jit" ratios are to this one; the state check compares to it
    floor: str
    peers: tuple[str, ...]
    headline: tuple[str, ...]  # the ratios in the headline table's cells
    section: str

    @property
    def floor_is(self) -> str:
        """What the group's floor does, in the words of the reports."""
        return FLOOR_DESCRIPTIONS[self.floor]

    def donated(self, **changes: Any) -> Group:
        """This group with each contender in its donated form (``DONATED_FORM``; those
        without one left out), and ``changes``."""
        form = {plain: donated for donated, plain in DONATED_FORM.items()}
        return replace(
            self,
            contenders=tuple(form[c] for c in self.contenders if c in form),
            baseline=form[self.baseline],
            floor=form[self.floor],
            peers=tuple(form[c] for c in self.peers if c in form),
            **changes,
        )


TRAINING = Group(
    name="training",
    title="Training loops",
    about="Each workload's step under every wrapper, none donating.",
    contenders=CONTENDERS,
    baseline=BASELINE,
    floor=FLOOR,
    peers=PEERS,
    headline=("jax_jit", "peer"),
    section="bench-harness",
)
DONATED = TRAINING.donated(
    name="donated",
    title="Training loops with donation",
    about=(
        "The training workloads as large training loops run them: every contender donates "
        "the state its step replaces (`donate_argnums`: `jax.jit` the parameters and the "
        "optimizer state it returns, `treeclone.jit[alias]` and `jit_partial` the state "
        "argument, the nnx wrappers the model and the optimizer; on `frozen_half` the frozen "
        "half is its own argument, not donated). Ratios are to `jax.jit[donate]` and to "
        "`floor[donate]`."
    ),
    headline=("jax_jit", "floor"),
    section="bench-donated",
)
EQUINOX = Group(
    name="equinox",
    title='An equinox model under traced="arrays"',
    about=(
        "An equinox Module with a function field (its activation), which `jax.jit` cannot "
        'take whole: `treeclone.jit(traced="arrays")` (equinox\'s rule) against '
        "`equinox.filter_jit` (the peer) and against `jax.jit` over `eqx.partition`'s arrays "
        "and its floor. Ratios are to `jax.jit` over the partition, to `equinox.filter_jit` "
        "and to the floor."
    ),
    contenders=(
        BASELINE,
        FLOOR,
        EQX,
        TC_CLONE_TRACED,
        TC_ALIAS_TRACED,
        TC_PARTIAL_TRACED,
        TC_ALIAS_PARTITIONED,
    ),
    baseline=BASELINE,
    floor=FLOOR,
    peers=(EQX,),
    headline=("jax_jit", "peer", "floor"),
    section="bench-equinox",
)
GROUPS = {g.name: g for g in (TRAINING, DONATED, EQUINOX)}


def group_of(wl: dict[str, Any]) -> Group:
    """The group of a workload's results (results written before groups: the training one)."""
    return GROUPS.get(wl.get("group", TRAINING.name), TRAINING)


# Every contender of every group, each once, in the groups' order.
ALL_CONTENDERS = tuple(dict.fromkeys(c for g in GROUPS.values() for c in g.contenders))


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
    for name in (BASELINE, FLOOR, BASELINE_DON, FLOOR_DON):
        av.wrappers[name] = jax.jit  # the workloads build the flat-array step and donation
    try:
        tc = importlib.import_module("treeclone")
        tc_jit = tc.jit
        if not callable(tc_jit):
            raise TypeError(f"treeclone.jit is not callable: {tc_jit!r}")
    except ModuleNotFoundError as e:
        why = (
            "not installed"
            if e.name == "treeclone"
            else f"treeclone.jit not available: {_short(e)}"
        )
        for name in TC_SPECS:
            av.skipped[name] = why
    except Exception as e:  # an ImportError, AttributeError, ... of a half-written package
        for name in TC_SPECS:
            av.skipped[name] = f"treeclone.jit not available: {_short(e)}"
    else:
        for name, (kind, policy, options) in TC_SPECS.items():
            if kind == "jit_partial":
                partial = getattr(tc, "jit_partial", None)
                if partial is None:
                    av.skipped[name] = "this treeclone has no jit_partial"
                    continue
                av.wrappers[name] = functools.partial(partial, policy=policy, **options)
            else:
                av.wrappers[name] = _with_policy(tc_jit, policy, **options)
            if _preserves_identity(policy):
                av.preserving |= {name}
    nnx_names = (NNX, NNX_TREE, NNX_PARTIAL, NNX_DON, NNX_TREE_DON, NNX_PARTIAL_DON)
    try:
        from flax import nnx
    except ImportError:
        for name in nnx_names:
            av.skipped[name] = "not installed"
    else:
        av.wrappers[NNX] = av.wrappers[NNX_DON] = nnx.jit
        av.preserving |= {NNX, NNX_DON}
        # Tree mode and jit_partial refuse shared Variables (they do not preserve identity).
        av.wrappers[NNX_TREE] = av.wrappers[NNX_TREE_DON] = functools.partial(nnx.jit, graph=False)
        for name in (NNX_PARTIAL, NNX_PARTIAL_DON):
            if hasattr(nnx, "jit_partial"):
                av.wrappers[name] = functools.partial(nnx.jit_partial, graph=False)
            else:
                av.skipped[name] = "this flax has no nnx.jit_partial"
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


def _with_policy(tc_jit: Callable[..., Any], policy: str, **options: Any) -> Callable[..., Any]:
    def wrap(fun: Callable[..., Any], **kwargs: Any) -> Any:
        return tc_jit(fun, policy=policy, **options, **kwargs)

    wrap.__name__ = f"treeclone.jit[{policy}]"
    return wrap


def donated_form(contender: str) -> tuple[str, bool]:
    """The contender whose form ``contender`` runs, and whether it donates."""
    if contender in DONATED_FORM:
        return DONATED_FORM[contender], True
    return contender, False


def describe_error(e: BaseException) -> str:
    return _short(e)
