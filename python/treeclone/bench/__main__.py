"""``python -m treeclone.bench``: time training loops under jax.jit, treeclone.jit and peers.

python -m treeclone.bench                      # full run, writes bench-out/
python -m treeclone.bench --quick --only mlp_adam,seed_pattern --out /tmp/b
python -m treeclone.bench --only donated,equinox --rounds 9   # the groups' workloads
python -m treeclone.bench --docs docs/benchmarks.md   # also rewrite the docs section
python -m treeclone.bench --from-results a/results.json b/results.json --docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

# steps: (aimed batch seconds, fewest, most) steps per timed batch unless --steps is given.
FULL = {"rounds": 15, "steps": (0.1, 10, 100), "check_steps": 5}
QUICK = {"rounds": 3, "steps": (0.02, 5, 20), "check_steps": 3}


def _parser(workload_names: list[str], group_names: list[str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m treeclone.bench",
        description="Time real training loops under jax.jit, treeclone.jit (clone, alias, "
        "strict), treeclone.jit_partial, flax.nnx.jit (graph mode, tree mode, jit_partial) "
        "and equinox.filter_jit, with the floor (one jax.jit over the flat arrays) as a "
        "reference, after checking that all of them compute the same thing; the donated "
        "group again with every contender donating its state, the equinox group under "
        "traced='arrays'. Writes results.json, report.md and bench.png.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a CI-sized smoke run: {QUICK['rounds']} rounds of batches of about "
        f"{QUICK['steps'][0] * 1000:g} ms, {QUICK['check_steps']} check steps; indicative only",
    )
    p.add_argument(
        "--out", type=Path, default=Path("bench-out"), help="output folder (default bench-out/)"
    )
    p.add_argument(
        "--device",
        help="cpu, gpu, cuda or tpu (default: JAX's default backend, an accelerator if any)",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="workloads to run (repeatable or comma-separated), or a group's name for all of "
        f"its workloads ({', '.join(group_names)}): {', '.join(workload_names)}",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="every workload at its smallest sizes (fewer layers, a shallower nnx model): the "
        "same steps, compiled faster; for CI's smoke test, never for the docs",
    )
    _add_timing_options(p)
    _add_output_options(p)
    return p


def _add_timing_options(p: argparse.ArgumentParser) -> None:
    """``--rounds``, ``--steps``, ``--check-steps`` and ``--rtol``."""
    p.add_argument(
        "--rounds",
        type=int,
        help=f"interleaved timing rounds (default {FULL['rounds']}; quick {QUICK['rounds']})",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="training steps per timed batch, the same for every contender (default: per "
        "workload, as many as make a batch of jax.jit take about "
        f"{FULL['steps'][0] * 1000:g} ms, within {FULL['steps'][1]}-{FULL['steps'][2]}; "
        f"quick: {QUICK['steps'][0] * 1000:g} ms, {QUICK['steps'][1]}-{QUICK['steps'][2]})",
    )
    p.add_argument(
        "--check-steps",
        type=int,
        help="steps whose losses are compared before timing (default "
        f"{FULL['check_steps']}; quick {QUICK['check_steps']})",
    )
    p.add_argument(
        "--rtol",
        type=float,
        help="relative tolerance of the loss check (default 1e-4 on CPU, 1e-2 on GPU)",
    )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """``--docs``, ``--from-results`` and ``--fail-on-error``."""
    p.add_argument(
        "--docs",
        type=Path,
        metavar="PATH",
        help="also write the report into this Markdown file, each group's workloads between "
        "the markers of its section and the device's platform (bench-harness for the "
        "training group on the CPU, bench-harness-tpu, bench-donated, bench-equinox-tpu, ...)",
    )
    p.add_argument(
        "--from-results",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: write report.md (and --docs) from these results.json files, merged "
        "(runs of disjoint workloads on one device, e.g. a device run split into commands)",
    )
    p.add_argument(
        "--fail-on-error",
        action="store_true",
        help="exit 1 if any contender failed its check or raised (default: only if jax.jit did)",
    )


def resolve_device(name: str | None) -> Any:
    import jax

    backend = jax.default_backend() if name is None else name.lower()
    backend = {"cuda": "gpu", "rocm": "gpu"}.get(backend, backend)
    try:
        devices = jax.devices(backend)
    except RuntimeError as e:
        raise SystemExit(f"error: no {name} device for JAX here: {e}") from None
    if not devices:
        raise SystemExit(f"error: no {name} device for JAX here")
    return devices[0]


def _load() -> float | None:
    """The 1-minute load average, where the system has one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _write_docs(path: Path, results: dict[str, Any]) -> None:
    """Each group's workloads into its section of ``path`` (the other sections kept)."""
    from . import report
    from .contenders import TRAINING

    platform = results.get("platform") or results["device"].split()[0]
    where = "" if platform == "cpu" else f" on {results['device']}"
    for group in report.groups_in(results):
        title = ("Training-loop results" if group is TRAINING else f"{group.title}") + where
        section = report.render(report.select(results, group), heading="###", title=title)
        report.write_section(path, section, platform, group.section)
        print(f"wrote the {platform} {group.section} section of {path}", file=sys.stderr)


def _from_results(paths: list[Path], out: Path, docs: Path | None) -> int:
    import json

    from . import report

    try:
        results = report.merge([json.loads(p.read_text()) for p in paths])
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report.render(results, heading="#"))
    print(f"wrote {out / 'report.md'}", file=sys.stderr)
    if docs is not None:
        _write_docs(docs, results)
    return 0


def expand_only(items: list[str]) -> list[str]:
    """The names ``--only`` gives (repeated, comma-separated), a group's name replaced by its
    workloads' names; unknown names are kept (the caller names them)."""
    from .contenders import GROUPS
    from .workloads import WORKLOADS

    only: list[str] = []
    for item in items:
        for name in (n.strip() for n in item.split(",")):
            if name in GROUPS:
                only += [w for w, cls in WORKLOADS.items() if cls.group.name == name]
            elif name:
                only.append(name)
    return only


class _UsageError(Exception):
    """A mistake on the command line: ``main`` prints it and exits with status 2."""


def _workload_names(args: argparse.Namespace) -> list[str]:
    """The workloads to run, in ``WORKLOADS``' order: all of them without ``--only``."""
    from .contenders import GROUPS
    from .workloads import WORKLOADS

    only = expand_only(args.only or [])
    unknown = [n for n in only if n not in WORKLOADS]
    if unknown:
        raise _UsageError(
            f"unknown workloads: {', '.join(unknown)} (known: {', '.join(WORKLOADS)}; "
            f"groups: {', '.join(GROUPS)})"
        )
    if args.tiny and args.docs is not None:
        raise _UsageError("--tiny runs are not for the docs (--docs)")
    return [n for n in WORKLOADS if n in only] if only else list(WORKLOADS)


def _counts(args: argparse.Namespace) -> tuple[int, int]:
    """The timing rounds and the check steps: given, or the preset's (``--quick``'s or the
    full run's)."""
    given = (args.rounds, args.steps, args.check_steps)
    if any(count is not None and count < 1 for count in given):  # (0 is given, not a default)
        raise _UsageError("--rounds, --steps and --check-steps must be at least 1")
    preset = QUICK if args.quick else FULL
    rounds = preset["rounds"] if args.rounds is None else args.rounds
    check_steps = preset["check_steps"] if args.check_steps is None else args.check_steps
    return rounds, check_steps


def _need_optax() -> None:
    try:
        import optax  # noqa: F401  (every workload trains with optax)
    except ImportError:
        raise _UsageError("optax is required: pip install 'treeclone[bench]' (or optax)") from None


def _config(args: argparse.Namespace, device: Any, rounds: int, check_steps: int) -> Any:
    """The harness's ``Config`` of this run on ``device`` (its tolerances: the platform's)."""
    from .harness import Config

    preset = QUICK if args.quick else FULL
    on_cpu = device.platform == "cpu"
    return Config(
        rounds=rounds,
        steps=args.steps,
        check_steps=check_steps,
        rtol=args.rtol if args.rtol is not None else (1e-4 if on_cpu else 1e-2),
        atol=1e-6 if on_cpu else 1e-4,
        batch_s=preset["steps"][0],
        min_steps=preset["steps"][1],
        max_steps=preset["steps"][2],
    )


def _new_results(
    args: argparse.Namespace,
    argv: list[str],
    device: Any,
    classes: dict[str, Any],
    cfg: Any,
) -> dict[str, Any]:
    """The results of a run as it starts: what runs, where and how; no workload's yet."""
    from . import report

    names = list(classes)
    contenders = list(dict.fromkeys(c for n in names for c in classes[n].group.contenders))
    return {
        "command": report.command_line(argv),
        "device": report.device_label(device),
        "platform": device.platform,
        "config": {
            "quick": args.quick,
            "tiny": args.tiny,
            "rounds": cfg.rounds,
            "steps": cfg.steps if cfg.steps is not None else "auto",
            "auto_steps": {
                "batch_s": cfg.batch_s,
                "min": cfg.min_steps,
                "max": cfg.max_steps,
            },
            "check_steps": cfg.check_steps,
            "rtol": cfg.rtol,
            "atol": cfg.atol,
            "workloads": names,
            "contenders": contenders,
        },
        "workloads": {},
    }


def _run(
    args: argparse.Namespace, argv: list[str], names: list[str], rounds: int, check_steps: int
) -> dict[str, Any]:
    """Run the workloads ``names``, writing the partial results after each (in case the run
    is cut short); the results, whole."""
    from . import report
    from .contenders import probe
    from .harness import run_workload
    from .progress import Progress
    from .workloads import WORKLOADS, tiny

    classes = {n: tiny(WORKLOADS[n]) if args.tiny else WORKLOADS[n] for n in names}
    device = resolve_device(args.device)
    cfg = _config(args, device, rounds, check_steps)
    av = probe()
    for c, why in av.skipped.items():
        print(f"note: {c}: skipped ({why})", file=sys.stderr)

    load_before = _load()
    started = time.perf_counter()
    progress = Progress(sum(len(classes[n].group.contenders) for n in names) * (1 + rounds))
    results = _new_results(args, argv, device, classes, cfg)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        results["workloads"][name] = run_workload(classes[name], device, av, cfg, progress)
        wl = results["workloads"][name]
        summary = ", ".join(
            f"{c} {res['median_us']:.1f}" if "median_us" in res else f"{c} {res.get('status', '?')}"
            for c, res in wl["contenders"].items()
        )
        progress.note(f"{name} (µs/step): {summary}")
        if i < len(names) - 1:  # partial results, in case the run is cut short
            results["elapsed_s"] = time.perf_counter() - started
            results["machine"] = report.machine_info(device)
            results["plot"] = f"none yet (partial results: {i + 1} of {len(names)} workloads)"
            report.write_json(out / "results.json", results)
            (out / "report.md").write_text(report.render(results, heading="#"))
    progress.close()
    results["elapsed_s"] = time.perf_counter() - started
    results["load"] = {"cores": os.cpu_count(), "before": load_before, "after": _load()}
    results["machine"] = report.machine_info(device)
    return results


def _write_outputs(out: Path, results: dict[str, Any], docs: Path | None) -> None:
    """The plot, ``results.json`` and ``report.md`` into ``out``, and the docs' sections."""
    from . import report

    no_plot = report.write_plot(out / "bench.png", results)
    results["plot"] = "`bench.png` in the output folder" if not no_plot else f"none ({no_plot})"
    report.write_json(out / "results.json", results)
    (out / "report.md").write_text(report.render(results, heading="#"))
    if docs is not None:
        _write_docs(docs, results)
    print(
        f"wrote {out / 'results.json'}, {out / 'report.md'}"
        + ("" if no_plot else f", {out / 'bench.png'}"),
        file=sys.stderr,
    )
    if no_plot:
        print(f"note: {no_plot}", file=sys.stderr)


def _exit_status(results: dict[str, Any], fail_on_error: bool) -> int:
    """1 when a group's baseline failed (the harness is broken) or, with ``fail_on_error``,
    any contender did; else 0."""
    from .contenders import GROUPS

    bad = [
        (name, c, res["status"])
        for name, wl in results["workloads"].items()
        for c, res in wl["contenders"].items()
        if res.get("status") in ("failed", "error")
    ]
    baselines = {g.baseline for g in GROUPS.values()}
    if any(c in baselines for _, c, _ in bad):
        print("error: jax.jit itself failed: the harness is broken", file=sys.stderr)
        return 1
    if bad and fail_on_error:
        print(f"error: {len(bad)} contender runs failed or raised", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from .contenders import GROUPS
    from .workloads import WORKLOADS

    args = _parser(list(WORKLOADS), list(GROUPS)).parse_args(argv)
    if args.from_results:
        return _from_results(args.from_results, args.out, args.docs)
    try:
        names = _workload_names(args)
        rounds, check_steps = _counts(args)
        _need_optax()
    except _UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = _run(args, argv, names, rounds, check_steps)
    _write_outputs(args.out, results, args.docs)
    return _exit_status(results, args.fail_on_error)


if __name__ == "__main__":
    sys.exit(main())
