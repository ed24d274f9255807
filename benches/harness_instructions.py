"""Instructions per step of the harness's own training loops (``python -m treeclone.bench``'s
workloads and contenders), counted by valgrind's callgrind: the host work each contender adds
to the same step, in a measure that does not drift with the machine's load. On a TPU these
small steps are host-bound, so this is the count to cut; no speed claim is made from it.

    python benches/harness_instructions.py                       # every workload, printed
    python benches/harness_instructions.py --workloads mlp_adam --calls 200
    python benches/harness_instructions.py --workloads mlp_adam \\
        --contenders 'treeclone.jit[alias]' floor --keep /tmp/cg    # dumps for callgrind_annotate

Each workload runs in one process under ``valgrind --tool=callgrind --instr-atstart=no``: each
contender's runner is built as the harness builds it (``Workload.runner``), compiled and warmed
up uninstrumented, then counting is switched on (``callgrind_control -i on``) for ``--calls``
steps, each one ``runner.run(1)`` waited on by its loss (the step's one computation is done
when its loss is), the count dumped, and again for three times as many; the difference of the
two counts over the difference in steps is the cost of one step, every thread included (the
loop, the wrapper, JAX's dispatch and XLA's execution of the step on the CPU). With ``--keep``
the dumps stay in that folder, named ``<workload>.<contender>.<n>`` (n: 1 and 3), for
``callgrind_annotate --inclusive=yes``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
from treeclone.bench.contenders import probe
from treeclone.bench.workloads import WORKLOADS as ALL_WORKLOADS

WORKLOADS = ("mlp_adam", "nnx_train_20", "mlp_adam_donated", "nnx_train_20_donated")
# Per group: the contenders counted (jax.jit, the floor, treeclone's policies that run the
# step in place and jit_partial).
TRAINING = (
    "jax.jit",
    "floor",
    "treeclone.jit[alias]",
    "treeclone.jit[strict]",
    "treeclone.jit_partial[alias]",
)
DONATED = (
    "jax.jit[donate]",
    "floor[donate]",
    "treeclone.jit[alias,donate]",
    "treeclone.jit[strict,donate]",
    "treeclone.jit_partial[alias,donate]",
)
HERE = Path(__file__).resolve().parent


def contenders_of(workload: str) -> tuple[str, ...]:
    return DONATED if workload.endswith("_donated") else TRAINING


def _control(*flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(os.getpid())], check=True, capture_output=True)


def child(workload: str, contenders: list[str], calls: int) -> None:
    """Under callgrind: each contender's two counted windows, dumped in order."""
    av = probe()
    device = jax.devices()[0]
    with jax.default_device(device):
        wl = ALL_WORKLOADS[workload](device, av.preserving)
        for contender in contenders:
            runner = wl.runner(contender, av.wrappers[contender])
            for _ in range(20):  # compile, and reach the steady state (the native call's caches)
                jax.block_until_ready(runner.run(1)[0])
            for n in (calls, 3 * calls):
                _control("--zero")
                _control("--instr=on")
                for _ in range(n):
                    jax.block_until_ready(runner.run(1)[0])
                _control("--instr=off")
                _control("--dump")


def _total(path: Path) -> int:
    """The count of a dump (its ``totals:`` line; ``summary:`` reads 0 in a dump on request)."""
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"{path}: no totals line (callgrind's dump format changed?)")


def _file_name(contender: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", contender).strip("_")


def measure(workload: str, contenders: list[str], calls: int, keep: Path | None) -> dict:
    """Instructions per step of each contender on ``workload``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            workload,
            "--calls",
            str(calls),
            "--contenders",
            *contenders,
        ]
        run = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
        if run.returncode != 0:
            raise SystemExit(f"{workload}: valgrind failed:\n{run.stderr[-3000:]}")
        parts = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(parts) != 2 * len(contenders):
            raise SystemExit(f"{workload}: expected {2 * len(contenders)} dumps, got {len(parts)}")
        counts = [_total(p) for p in parts]
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for i, p in enumerate(parts):
                name = f"{workload}.{_file_name(contenders[i // 2])}.{1 + 2 * (i % 2)}"
                shutil.copy(p, keep / name)
    return {c: (counts[2 * i + 1] - counts[2 * i]) / (2 * calls) for i, c in enumerate(contenders)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="steps in the first window")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--contenders", nargs="+", help="default: the workload group's")
    parser.add_argument("--keep", type=Path, help="keep the dumps in this folder")
    parser.add_argument("--child", metavar="WORKLOAD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.contenders, args.calls)
        return 0
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("valgrind (with callgrind_control) is needed: apt-get install valgrind")

    def one(workload: str) -> dict:
        contenders = args.contenders or list(contenders_of(workload))
        return measure(workload, contenders, args.calls, args.keep)

    with ThreadPoolExecutor(max_workers=2) as pool:  # one valgrind per core
        results = dict(zip(args.workloads, pool.map(one, args.workloads), strict=True))
    for workload, counts in results.items():
        floor = next((n for c, n in counts.items() if c.startswith("floor")), None)
        print(f"{workload}: k instructions per step (ratio to the floor)")
        for c, n in counts.items():
            ratio = f" ({n / floor:.3f})" if floor else ""
            print(f"  {c:40s} {n / 1e3:10,.1f}{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
