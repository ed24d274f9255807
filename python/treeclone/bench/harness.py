"""Run one workload: check that every contender computes the same thing, then time it.

Per workload:

1. the plain-Python (un-jitted) reference runs, one per semantics the contenders need;
2. per contender of the workload's group (``contenders.Group``): build its runner, run the
   check steps one at a time (the first one traces and compiles: that is the warm-up,
   excluded from timing), compare the losses with the reference of its semantics, its final
   state (``Runner.state``) with the group baseline's (``jax.jit``, ``jax.jit[donate]``) where
   both have the same semantics, and run its extra check; a contender that disagrees is a
   failure and is not timed;
3. one untimed batch per remaining contender, then interleaved rounds: each round times
   every contender once (a batch of ``steps`` steps, then ``jax.block_until_ready`` on the
   outputs, or on the arrays ``Runner.arrays`` reads from them), in the orders of
   ``timing.interleaved`` (each contender follows every other equally often). The garbage
   collector runs once before the rounds and is off during each batch.
"""

from __future__ import annotations

import gc
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .contenders import (
    TC_POLICY,
    TRAINING,
    Availability,
    Group,
    describe_error,
    is_policy_rejection,
)
from .progress import Progress
from .timing import interleaved
from .workloads import NotApplicable, Runner, Workload


@dataclass
class Config:
    rounds: int
    steps: int | None  # steps per timed batch; None: chosen per workload (``auto_steps``)
    check_steps: int
    rtol: float
    atol: float
    batch_s: float = 0.1  # with steps=None: the batch time to aim for...
    min_steps: int = 10  # ...within these bounds
    max_steps: int = 100


def auto_steps(cfg: Config, seconds_per_step: float) -> int:
    """Steps per batch so that a batch takes about ``cfg.batch_s`` (same for all contenders)."""
    if cfg.steps is not None:
        return cfg.steps
    want = math.ceil(cfg.batch_s / max(seconds_per_step, 1e-9))
    return max(cfg.min_steps, min(cfg.max_steps, want))


def _stats(samples: list[float]) -> dict[str, Any]:
    a = np.asarray(samples, dtype=float)
    q1, med, q3 = (float(v) for v in np.percentile(a, [25, 50, 75]))
    return {
        "median_us": med,
        "q1_us": q1,
        "q3_us": q3,
        "min_us": float(a.min()),
        "max_us": float(a.max()),
        "steps_per_s": 1e6 / med if med > 0 else math.inf,
        "samples_us": [float(v) for v in a],
    }


def _losses_agree(got: list[float], want: list[float], rtol: float, atol: float) -> bool:
    return len(got) == len(want) and bool(np.allclose(got, want, rtol=rtol, atol=atol))


def _fmt_losses(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.7g}" for v in values) + "]"


def run_workload(
    wl_cls: type[Workload],
    device: Any,
    av: Availability,
    cfg: Config,
    progress: Progress,
) -> dict[str, Any]:
    name = wl_cls.name
    group = wl_cls.group
    contenders = group.contenders
    out: dict[str, Any] = {
        "group": group.name,
        "title": wl_cls.title,
        "description": wl_cls.description,
        "compared": wl_cls.compared,
        "status": "ok",
        "references": {},
        "contenders": {},
    }
    results: dict[str, dict[str, Any]] = out["contenders"]
    with jax.default_device(device):
        progress.set_label(f"{name}: reference run (no jit)")
        try:
            wl = wl_cls(device, av.preserving)
            for sem in sorted({wl.semantics(c) for c in contenders}):
                t0 = time.perf_counter()
                losses = wl.reference_losses(sem, cfg.check_steps)
                out["references"][sem] = {
                    "losses": losses,
                    "seconds": time.perf_counter() - t0,
                }
        except Exception as e:
            out["status"] = f"error in the reference run: {describe_error(e)}"
            for c in contenders:
                results[c] = {"status": "error", "detail": "the reference run failed"}
            progress.advance(len(contenders) * (1 + cfg.rounds))
            return out

        runners: dict[str, Runner] = {}
        baseline: dict[str, Any] = {}  # the group baseline's final state, once checked
        for c in contenders:
            progress.set_label(f"{name}: check {c}")
            res = results.setdefault(c, {})
            res["semantics"] = wl.semantics(c)
            if c in av.skipped:
                res.update(status="skipped", detail=av.skipped[c])
                progress.advance(1 + cfg.rounds)
                continue
            runner = _check(wl, c, av, cfg, res, out["references"], baseline, group)
            if runner is None:
                progress.advance(1 + cfg.rounds)
                continue
            runners[c] = runner
            progress.advance(1)

        if runners:
            progress.set_label(f"{name}: timing {len(runners)} contenders")
            steps, samples = _time_rounds(runners, cfg, progress)
            out["steps_per_batch"] = steps
            for c, runner in runners.items():
                results[c].update(_stats(samples[c]))
                results[c]["traces"] = runner.traces.n
                if runner.traces.n != results[c]["traces_after_check"]:
                    results[c]["notes"].append(
                        f"retraced during timing: {runner.traces.n} traces in all"
                    )
            add_ratios(out, group)
    return out


def add_ratios(out: dict[str, Any], group: Group = TRAINING) -> None:
    """Each timed contender's ratio of medians to the group's baseline (``jax.jit``, or
    ``jax.jit[donate]``), to the fastest peer (``group.peers``: the other libraries'
    wrappers) and to the group's floor; the fastest peer's name in ``out``."""
    results = out["contenders"]
    timed = {c: r["median_us"] for c, r in results.items() if "median_us" in r}
    peers = {c: t for c, t in timed.items() if c in group.peers}
    fastest = min(peers, key=peers.__getitem__) if peers else None
    out["fastest_peer"] = fastest
    for c, med in timed.items():
        refs = (("jax_jit", group.baseline), ("peer", fastest), ("floor", group.floor))
        for key, ref in refs:
            base = timed.get(ref) if ref is not None else None
            results[c][f"ratio_to_{key}"] = med / base if base else None


def _check(
    wl: Workload,
    c: str,
    av: Availability,
    cfg: Config,
    res: dict[str, Any],
    references: dict[str, Any],
    baseline: dict[str, Any] | None = None,
    group: Group = TRAINING,
) -> Runner | None:
    """Build and check one contender; fill ``res``; return the runner if it may be timed.

    ``baseline`` holds the group baseline's final state once it passed (``semantics`` and
    ``leaves``); filled here when ``c`` is the baseline, compared with otherwise."""
    res["notes"] = []
    losses: list[float] = []
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runner = wl.runner(c, av.wrappers[c])
            res["notes"] = runner.notes  # the same list: notes added later show up too
            t0 = time.perf_counter()
            outputs = None
            for i in range(cfg.check_steps):
                outputs = runner.run(1)
                losses.append(float(outputs[0]))
                if i == 0:
                    res["first_step_s"] = time.perf_counter() - t0
            res["check_s"] = time.perf_counter() - t0
    except NotApplicable as e:
        res.update(status="not applicable", detail=str(e))
        return None
    except Exception as e:
        if c in TC_POLICY and is_policy_rejection(e):
            res.update(
                status="not applicable",
                detail=f"the {TC_POLICY[c]} policy rejects this step: {describe_error(e)}",
            )
        else:
            res.update(status="error", detail=describe_error(e))
        if losses:
            res["check_losses"] = losses
        return None
    # What JAX or a wrapper warned of while the contender traced and ran its check steps (a
    # donation that could not be used, a MutationWarning), each once, in the report's notes.
    for text in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught):
        runner.notes.append("warned: " + text.splitlines()[0])
    res["check_losses"] = losses
    res["traces_after_check"] = runner.traces.n
    want = references[runner.semantics]["losses"]
    if not _losses_agree(losses, want, cfg.rtol, cfg.atol):
        others = [
            sem
            for sem, ref in references.items()
            if sem != runner.semantics and _losses_agree(losses, ref["losses"], cfg.rtol, cfg.atol)
        ]
        detail = (
            f"losses {_fmt_losses(losses)} disagree with the {runner.semantics} reference "
            f"{_fmt_losses(want)} (rtol {cfg.rtol:g})"
        )
        if others:
            detail += f"; they match the {others[0]} reference instead"
        res.update(status="failed", detail=detail)
        return None
    problem = _unwaited(runner, outputs)
    if not problem and baseline is not None:
        try:
            problem = _state_differs(c, runner, baseline, group, cfg)
        except Exception as e:
            problem = f"reading its final state raised {describe_error(e)}"
    if runner.verify is not None and not problem:
        try:
            problem = runner.verify()
        except Exception as e:
            problem = f"the extra check raised {describe_error(e)}"
    if problem:
        res.update(status="failed", detail=problem)
        return None
    res.update(status="ok", detail="")
    return runner


def _state_differs(
    c: str, runner: Runner, baseline: dict[str, Any], group: Group, cfg: Config
) -> str | None:
    """None, or how ``runner``'s final state differs from the group baseline's (recorded
    here when ``c`` is the baseline). Every leaf is compared, to rtol and atol; a contender of
    another semantics (the tied embeddings kept tied) or without ``state()`` is not."""
    if runner.state is None:
        return None
    # Copies: a NumPy view of a CPU array kept (the baseline's) would stop its donation.
    leaves = [np.array(a, copy=True) for a in jax.tree.leaves(runner.state())]
    if c == group.baseline:
        baseline.update(semantics=runner.semantics, leaves=leaves)
        return None
    if "leaves" not in baseline or baseline["semantics"] != runner.semantics:
        return None
    want = baseline["leaves"]
    if len(leaves) != len(want):
        return (
            f"its final state has {len(leaves)} arrays, {group.baseline}'s {len(want)}: "
            "not the same state"
        )
    for i, (a, b) in enumerate(zip(leaves, want, strict=True)):
        if a.shape != b.shape or not np.allclose(a, b, rtol=cfg.rtol, atol=cfg.atol):
            diff = (
                f"shape {a.shape} against {b.shape}"
                if a.shape != b.shape
                else f"largest difference {float(np.max(np.abs(a - b))):.3g}"
            )
            return (
                f"its final state differs from {group.baseline}'s: array {i} of "
                f"{len(leaves)}, {diff} (rtol {cfg.rtol:g}, atol {cfg.atol:g})"
            )
    return None


def _unwaited(runner: Runner, outputs: Any) -> str | None:
    """None, or why the arrays ``runner.arrays`` reads are not all of ``outputs``' arrays (a
    batch whose timed wait missed some would be timed before its work is done)."""
    if runner.arrays is None or outputs is None:
        return None
    waited = {id(x) for x in runner.arrays(outputs)}
    missed = [
        x for x in jax.tree.leaves(outputs) if isinstance(x, jax.Array) and id(x) not in waited
    ]
    if missed:
        return f"the runner's arrays() misses {len(missed)} of the outputs' arrays"
    return None


def _time_batch(runner: Runner, steps: int) -> float:
    """Microseconds per step over one batch of ``steps`` steps, outputs ready."""
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        outputs = runner.run(steps)
        jax.block_until_ready(outputs if runner.arrays is None else runner.arrays(outputs))
        t = time.perf_counter_ns() - t0
    finally:
        gc.enable()
    return t / steps / 1000.0


def _time_rounds(
    runners: dict[str, Runner], cfg: Config, progress: Progress
) -> tuple[int, dict[str, list[float]]]:
    names = list(runners)
    # One untimed batch each (caches, allocator, first-call paths). The first contender's
    # (jax.jit's, when it runs) also sizes the batches when --steps is not given.
    probe_steps = cfg.steps or cfg.min_steps
    t0 = time.perf_counter()
    jax.block_until_ready(runners[names[0]].run(probe_steps))
    steps = auto_steps(cfg, (time.perf_counter() - t0) / probe_steps)
    for name in names:
        jax.block_until_ready(runners[name].run(steps))
    # Collect once here, not before each batch: a collection right before a batch slows
    # its first steps down (several hundred µs on a small CPU machine), a distortion.
    gc.collect()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name in interleaved(names, cfg.rounds):
        samples[name].append(_time_batch(runners[name], steps))
        progress.advance(1)
    return steps, samples
