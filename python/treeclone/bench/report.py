"""What a run writes: machine information, ``results.json``, ``report.md``, ``bench.png``,
and the generated section of a Markdown file (``--docs``). The parts all benchmarks share
(machine, formatting, the section writer) are in ``timing``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from . import timing
from .contenders import GROUPS, TRAINING, Group, group_of
from .timing import format_us

BEGIN = "<!-- bench-harness:begin -->"
END = "<!-- bench-harness:end -->"


def section_markers(platform: str, section: str = TRAINING.section) -> tuple[str, str]:
    """The markers of a run's section in the docs: ``bench-harness`` for the CPU, one section
    per accelerator platform (``bench-harness-tpu``, ``bench-harness-gpu``) beside it; each
    group of workloads has its own (``section``: ``bench-donated``, ``bench-equinox``)."""
    name = section if platform == "cpu" else f"{section}-{platform}"
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def groups_in(results: dict[str, Any]) -> list[Group]:
    """The groups of the workloads in ``results``, in ``GROUPS``' order."""
    present = {group_of(wl).name for wl in results["workloads"].values()}
    return [g for g in GROUPS.values() if g.name in present]


def select(results: dict[str, Any], group: Group) -> dict[str, Any]:
    """``results`` with only the workloads of ``group``."""
    workloads = {n: wl for n, wl in results["workloads"].items() if group_of(wl) is group}
    return {**results, "workloads": workloads}


# --------------------------------------------------------------------------- machine


def device_label(device: Any) -> str:
    """``cpu``, or ``gpu (NVIDIA H100 80GB HBM3)``: the platform and, if it says more, the kind."""
    kind = str(getattr(device, "device_kind", "") or "")
    return (
        device.platform if kind.lower() in ("", device.platform) else f"{device.platform} ({kind})"
    )


def machine_info(device: Any) -> dict[str, str]:
    import jax

    return timing.machine_info(
        ("jax", "jaxlib", "flax", "equinox", "optax", "numpy", "treeclone"),
        extra={
            "jax default backend": jax.default_backend(),
            "device": f"{device_label(device)}: {device}",
        },
    )


# --------------------------------------------------------------------------- formatting


def _status(res: dict[str, Any]) -> str:
    status, detail = res.get("status", "?"), res.get("detail", "")
    text = f"{status} ({detail})" if detail and status != "ok" else status
    if status in ("failed", "error"):
        text = f"**{text}**"
    return text.replace("|", "\\|").replace("\n", " ")


def _ratio(res: dict[str, Any], key: str) -> str:
    ratio = res.get(f"ratio_to_{key}")
    return "—" if ratio is None else f"{ratio:.2f}x"


def _ratio_header(group: Group, key: str) -> str:
    if key == "jax_jit":
        return f"vs {group.baseline}"
    if key == "floor":
        return f"vs {group.floor}"
    return "vs fastest peer" if len(group.peers) > 1 else f"vs {group.peers[0]}"


def workload_table(wl: dict[str, Any]) -> list[str]:
    group = group_of(wl)
    ratios = " | ".join(_ratio_header(group, k) for k in ("jax_jit", "peer", "floor"))
    lines = [
        f"| contender | µs/step (median) | spread: IQR (min–max) | {ratios} "
        "| steps/s | traces | 1st step s | semantics | status |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|",
    ]
    for c in group.contenders:
        res = wl["contenders"].get(c, {})
        if "median_us" in res:
            cells = [
                format_us(res["median_us"]),
                f"{format_us(res['q1_us'])}–{format_us(res['q3_us'])} "
                f"({format_us(res['min_us'])}–{format_us(res['max_us'])})",
                _ratio(res, "jax_jit"),
                _ratio(res, "peer"),
                _ratio(res, "floor"),
                f"{res['steps_per_s']:,.0f}",
                str(res.get("traces", "—")),
            ]
        else:
            cells = ["—"] * 7
        first = res.get("first_step_s")
        cells.append("—" if first is None else f"{first:.2f}")
        row = [f"`{c}`", *cells, res.get("semantics", "—"), _status(res)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def headline_table(results: dict[str, Any], group: Group = TRAINING) -> list[str]:
    """Contenders of ``group`` by workload of that group: each cell is the ratios of medians
    of ``group.headline`` (the training group's: to jax.jit, then to the workload's fastest
    peer; below 1x: faster)."""
    names = [n for n, wl in results["workloads"].items() if group_of(wl) is group]
    lines = [
        "| contender | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "--:|" * len(names),
    ]
    if len(group.peers) > 1:
        lines.append(
            "| *fastest peer* | "
            + " | ".join(f"`{results['workloads'][n].get('fastest_peer') or '—'}`" for n in names)
            + " |"
        )
    for c in group.contenders:
        cells = []
        for n in names:
            res = results["workloads"][n]["contenders"].get(c, {})
            if "median_us" in res:
                cells.append(" / ".join(_ratio(res, k) for k in group.headline))
            else:
                cells.append(res.get("status", "—").replace("|", "\\|"))
        lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
    return lines


def headline_text(group: Group) -> str:
    """What the cells of ``group``'s headline table are."""
    if group is TRAINING:
        return (
            "Headline: each contender's ratio of median step times to `jax.jit`, then to the "
            "workload's fastest peer (the fastest of `jax.jit` and the flax nnx and equinox "
            "wrappers; below 1x is faster). Details, the floor and every other figure follow "
            "per workload."
        )
    names = {"jax_jit": f"`{group.baseline}`", "floor": f"`{group.floor}`"}
    names["peer"] = f"`{group.peers[0]}`" if len(group.peers) == 1 else "the fastest peer"
    ratios = ", then ".join(f"to {names[k]}" for k in group.headline)
    return (
        f"{group.title}: {group.about} Headline: each contender's ratio of median step "
        f"times {ratios} (below 1x is faster). Every figure follows per workload."
    )


def noise_warning(results: dict[str, Any]) -> str:
    """A sentence when the run was made under load (so its numbers are noisy), else ''."""
    load = results.get("load", {})
    cores = load.get("cores") or 1
    before, after = load.get("before"), load.get("after")
    spreads = [
        (r["q3_us"] - r["q1_us"]) / r["median_us"]
        for wl in results["workloads"].values()
        for r in wl["contenders"].values()
        if r.get("median_us")
    ]
    spread = sorted(spreads)[len(spreads) // 2] if spreads else 0.0
    reasons = []
    if before is not None and before > 0.5 * cores:
        reasons.append(f"the load average was {before:.2f} on {cores} cores before the run started")
    if spread > 0.15:
        reasons.append(f"the median spread (IQR / median) over all timings is {spread:.0%}")
    if not reasons:
        return ""
    return (
        "**Noisy run**: "
        + " and ".join(reasons)
        + f" (load average {after if after is not None else float('nan'):.2f} at the end). "
        "Ratios between contenders, measured interleaved, hold better than absolute times; "
        "rerun on an idle machine before drawing conclusions."
    )


def render(
    results: dict[str, Any], heading: str = "#", title: str = "Training-loop benchmarks"
) -> str:
    """The report as Markdown; ``heading`` is the level of its title ('#', '##', ...)."""
    sub = heading + "#"
    cfg = results["config"]
    lines = [
        f"{heading} {title}",
        "",
        f"Produced by `{results['command']}` on device `{results['device']}`: "
        f"{cfg['rounds']} interleaved rounds per workload, each timing one batch of steps "
        f"per contender, after {cfg['check_steps']} checked warm-up steps (compilation "
        "excluded)."
        + (" **Quick run: few steps and rounds, indicative only.**" if cfg["quick"] else "")
        + (
            " **Tiny run: the workloads at their smallest sizes (CI's smoke test), not the "
            "sizes their descriptions give.**"
            if cfg.get("tiny")
            else ""
        ),
        "",
    ]
    warning = noise_warning(results)
    if warning:
        lines += [warning, ""]
    groups = groups_in(results)
    for group in groups:
        lines += [headline_text(group), "", *headline_table(results, group), ""]
    lines += [f"- {k}: {v}" for k, v in results["machine"].items()]
    floors = " ".join(dict.fromkeys(g.floor_is for g in groups))
    lines += [
        "",
        "µs/step is the median over rounds of (batch time / steps), the batch ending with "
        "`jax.block_until_ready` on the outputs' arrays (an in-place nnx form's read from "
        "its Variables, a functional one's by treeclone's native flatten); the spread is the "
        "interquartile range over "
        "rounds (and min–max); *vs jax.jit*, *vs fastest peer* and *vs floor* are ratios of "
        f"medians (below 1x is faster). {floors} "
        "*traces* counts how often the step's Python body ran (1 = traced once); "
        "*1st step s* is the wall time of the first step: tracing and compiling. "
        "Before timing, each contender's losses over the check steps must agree with a "
        f"plain-Python (un-jitted) run of the same semantics (rtol {cfg['rtol']:g}), and its "
        "state after them (every array of the parameters, or of the whole state where the "
        "workload's forms share one) with its group baseline's (`jax.jit`'s, "
        "`jax.jit[donate]`'s) where they have the same semantics; one that disagrees is "
        "marked failed and not timed.",
        "",
    ]
    if results.get("plot"):
        lines += [f"Chart: {results['plot']}.", ""]
    for name, wl in results["workloads"].items():
        lines += [f"{sub} `{name}`: {wl['title']}", "", wl["description"], ""]
        lines += [f"Compared: {wl['compared']}", ""]
        if "steps_per_batch" in wl:
            lines += [f"Timed in batches of {wl['steps_per_batch']} steps.", ""]
        if wl["status"] != "ok":
            lines += [f"**{wl['status']}**", ""]
        lines += workload_table(wl)
        notes = [
            f"- `{c}`: {note}"
            for c in group_of(wl).contenders
            for note in wl["contenders"].get(c, {}).get("notes", [])
        ]
        if notes:
            lines += ["", "Notes:", ""] + notes
        lines.append("")
    lines.append(f"Total time of the run: {results['elapsed_s']:.1f} s.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- files


def write_json(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def write_plot(path: Path, results: dict[str, Any]) -> str:
    """bench.png: grouped bars of µs/step. Returns '' or why no chart was drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart (pip install matplotlib)"
    workloads = list(results["workloads"])
    contenders = [
        c
        for c in dict.fromkeys(c for g in groups_in(results) for c in g.contenders)
        if any("median_us" in wl["contenders"].get(c, {}) for wl in results["workloads"].values())
    ]
    if not workloads or not contenders:
        return "nothing was timed: no chart"
    width = 0.8 / len(contenders)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(workloads) + 2), 4.5))
    for i, c in enumerate(contenders):
        xs, ys, lo, hi = [], [], [], []
        for j, name in enumerate(workloads):
            res = results["workloads"][name]["contenders"].get(c, {})
            ratio = res.get("ratio_to_jax_jit")
            if ratio:
                scale = ratio / res["median_us"]  # the IQR in the same units
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(ratio)
                lo.append((res["median_us"] - res["q1_us"]) * scale)
                hi.append((res["q3_us"] - res["median_us"]) * scale)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=c)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads, rotation=25, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("step time / jax.jit's (median, IQR; log scale)")
    # Two lines, the device's name wrapped to the figure's width: a long name (a GPU's, with
    # its backend) ran past the right edge on one line.
    fig_width_chars = int(fig.get_figwidth() * 10)
    device = textwrap.fill(f"on {results['device']}", width=fig_width_chars)
    ax.set_title(f"Training-loop step time relative to jax.jit (lower is better)\n{device}")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def write_section(
    path: Path, section: str, platform: str = "cpu", name: str = TRAINING.section
) -> None:
    """Put ``section`` between the markers of ``platform``'s section ``name`` of ``path``,
    keeping the rest of the file."""
    timing.write_section(path, section, *section_markers(platform, name))


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One set of results from runs of the same harness on disjoint workloads (a device run
    split into commands that each fit a time limit): the first run's configuration, every
    run's workloads in order, the commands joined with ``;``; a machine detail the runs
    differ in (revision, date, load) is given per run, with the workloads it applies to."""
    merged = dict(runs[0])
    machine = {}
    for key, first in runs[0].get("machine", {}).items():
        values = [r.get("machine", {}).get(key, "") for r in runs]
        machine[key] = (
            first
            if all(v == first for v in values)
            else "; ".join(
                f"{v} ({', '.join(f'`{w}`' for w in r['workloads'])})"
                for v, r in zip(values, runs, strict=True)
            )
        )
    merged["machine"] = machine
    merged["command"] = " ; ".join(r["command"] for r in runs)
    merged["workloads"] = {}
    for r in runs:
        if r["device"] != runs[0]["device"] or r["config"]["rounds"] != runs[0]["config"]["rounds"]:
            raise ValueError("runs on different devices or with different rounds do not merge")
        twice = set(merged["workloads"]) & set(r["workloads"])
        if twice:
            raise ValueError(f"workloads in more than one run: {', '.join(sorted(twice))}")
        merged["workloads"].update(r["workloads"])
    merged["config"] = {**runs[0]["config"], "workloads": list(merged["workloads"])}
    merged["elapsed_s"] = sum(r.get("elapsed_s", 0.0) for r in runs)
    return merged


def command_line(argv: list[str]) -> str:
    """The command as the user typed it (console script or ``python -m``)."""
    import shlex

    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    head = "treeclone-bench" if prog == "treeclone-bench" else "python -m treeclone.bench"
    return f"{head} {shlex.join(argv)}".strip()
