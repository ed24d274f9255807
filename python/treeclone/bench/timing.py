"""What every treeclone benchmark shares: the machine it ran on, interleaved timing of batches,
microsecond formatting, and the generated sections of ``docs/benchmarks.md``.

Used by the training-loop harness (``python -m treeclone.bench``) and by the table generators
``benches/tree_table.py`` and ``benches/jit_table.py``, so that all three describe the machine
the same way, time the same way and write their sections the same way.
"""

from __future__ import annotations

import datetime as _dt
import gc
import importlib
import importlib.metadata
import itertools
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- machine

# The packages the tables list (the harness names its own).
TABLE_PACKAGES = ("treeclone", "jax", "jaxlib", "optree", "numpy")


def dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def processor_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def treeclone_info() -> str:
    try:
        tc = importlib.import_module("treeclone")
    except Exception as e:
        return f"not importable ({type(e).__name__})"
    version = dist_version("treeclone")
    if version == "not installed":
        version = str(getattr(tc, "__version__", "unknown"))
    where = Path(tc.__file__).resolve().parent if getattr(tc, "__file__", None) else "?"
    return f"{version} from {where}"


def git_revision() -> str:
    """The revision benchmarks name: ``$TREECLONE_REVISION`` when set (a run on another machine
    of a wheel built here, whose copy of the tree has a git state of its own), else the git
    checkout of this file or of the working directory."""
    given = os.environ.get("TREECLONE_REVISION", "").strip()
    if given:
        return given
    for where in (Path(__file__).resolve().parent, Path.cwd()):
        rev = _git_revision_at(where)
        if rev:
            return rev
    return "unknown (not a git checkout)"


def _git_revision_at(here: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        rev = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return rev + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def host_info() -> dict[str, str]:
    """The machine and interpreter a benchmark ran on."""
    u = platform.uname()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    return {
        "platform": f"{u.system} {u.release} ({u.machine})",
        "processor": processor_name(),
        "cpus": f"{os.cpu_count()} ({usable} usable by this process)",
        "load average (1, 5, 15 min) at the end": load,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def machine_info(
    packages: Sequence[str] = TABLE_PACKAGES, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """Host, the versions of ``packages`` (in that order), git revision, ``extra``, date."""
    return {
        **host_info(),
        **{p: treeclone_info() if p == "treeclone" else dist_version(p) for p in packages},
        "git revision": git_revision(),
        **(extra or {}),
        "date (UTC)": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M"),
    }


# --------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class BoundCall:
    """A call bound beforehand, made as ``fn(*args, **kwargs)`` (no wrapper frame)."""

    fn: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


def interleaved(names: Sequence[str], rounds: int) -> Iterator[str]:
    """Every name once per round, in orders that balance what runs just before each: a batch
    can leave work for the next one (the flat-array floor's batch made whatever ran after it
    13-15% slower on nnx_train_20 on a 2-core CPU, main-thread time included), so rotating
    one order, where each name always follows the same other, biases a ratio by that much.
    The rounds run the rows of a Williams design (a Latin square in which each name follows
    every other exactly once; for an odd count, the square and its rows reversed), cycled.

    >>> from treeclone.bench.timing import interleaved
    >>> list(interleaved("abcd", 2))
    ['a', 'b', 'd', 'c', 'b', 'c', 'a', 'd']
    >>> rows = [list(interleaved("abcd", 4))[i : i + 4] for i in range(0, 16, 4)]
    >>> sorted(r[i] + r[i + 1] for r in rows for i in range(3)) == sorted(
    ...     a + b for a in "abcd" for b in "abcd" if a != b
    ... )
    True
    """
    names = list(names)
    n = len(names)
    # 0, 1, n-1, 2, n-2, ...: successive differences that are all distinct mod n.
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]
    square = [[(k + r) % n for k in first] for r in range(n)]
    if n % 2:
        square += [row[::-1] for row in square]
    for r in range(rounds):
        yield from (names[k] for k in square[r % len(square)])


def time_batch(call: BoundCall, n: int) -> int:
    """Nanoseconds for ``n`` back-to-back calls."""
    fn, args, kwargs = call.fn, call.args, call.kwargs
    loop = itertools.repeat(None, n)
    t0 = time.perf_counter_ns()
    for _ in loop:
        fn(*args, **kwargs)
    return time.perf_counter_ns() - t0


def calls_per_batch(call: BoundCall, batch_ns: int) -> int:
    """How many calls make one batch of about ``batch_ns`` (after a short warm-up)."""
    time_batch(call, 3)
    n = 1
    while True:
        t = time_batch(call, n)
        if t >= batch_ns // 4 or n >= 1 << 24:
            break
        n *= 4 if t < batch_ns // 16 else 2
    return max(1, round(n * batch_ns / max(t, 1)))


def measure_cell(calls: dict[str, BoundCall], rounds: int, batch_ns: int) -> dict[str, dict]:
    """Interleaved rounds over all contenders of one cell; per-call times in microseconds.

    The garbage collector runs once before and is off throughout.
    """
    names = list(calls)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sizes = {name: calls_per_batch(calls[name], batch_ns) for name in names}
        samples: dict[str, list[float]] = {name: [] for name in names}
        for name in interleaved(names, rounds):
            n = sizes[name]
            samples[name].append(time_batch(calls[name], n) / n / 1000.0)
    finally:
        if was_enabled:
            gc.enable()
    return {
        name: {
            "median_us": statistics.median(samples[name]),
            "min_us": min(samples[name]),
            "max_us": max(samples[name]),
            "calls_per_batch": sizes[name],
            "samples_us": samples[name],
        }
        for name in names
    }


# --------------------------------------------------------------------------- formatting


def format_us(x: float | None, missing: str = "—") -> str:
    """Microseconds with 2, 1 or 0 decimals by size; ``missing`` for None."""
    if x is None:
        return missing
    if x < 10:
        return f"{x:.2f}"
    if x < 1000:
        return f"{x:.1f}"
    return f"{x:,.0f}"


# --------------------------------------------------------------------------- docs


def script_command(script: str, argv: list[str] | None) -> str:
    """How a table generator was run, for its table: ``python benches/<script> <args>``."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", f"benches/{script}", *args])


def write_section(path: Path, section: str, begin: str, end: str, intro: str = "") -> None:
    """Put ``section`` between the markers ``begin`` and ``end`` in ``path``, keeping the rest
    of the file; without the markers it is appended (to ``intro`` if there is no file yet)."""
    block = f"{begin}\n{section}{end}\n"
    text = path.read_text() if path.exists() else intro
    i, j = text.find(begin), text.find(end)
    if i != -1 and j > i:
        text = text[:i] + block + text[j + len(end) :].lstrip("\n")
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
