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
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
from call_instructions import count_windows, counted_dumps, per_call, total
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


def contenders_of(workload: str) -> tuple[str, ...]:
    return DONATED if workload.endswith("_donated") else TRAINING


def child(workload: str, contenders: list[str], calls: int) -> None:
    """Under callgrind: each contender's two counted windows, dumped in order."""
    av = probe()
    device = jax.devices()[0]
    with jax.default_device(device):
        wl = ALL_WORKLOADS[workload](device, av.preserving)
        for contender in contenders:
            runner = wl.runner(contender, av.wrappers[contender])
            count_windows(lambda r=runner: jax.block_until_ready(r.run(1)[0]), calls)


def _file_name(contender: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", contender).strip("_")


def measure(workload: str, contenders: list[str], calls: int, keep: Path | None) -> dict:
    """Instructions per step of each contender on ``workload``."""
    args = [workload, "--calls", str(calls), "--contenders", *contenders]
    with tempfile.TemporaryDirectory() as tmp:
        parts = counted_dumps(__file__, args, Path(tmp), workload)
        counts = [total(p) for p in parts]
        if keep is not None and len(parts) == 2 * len(contenders):
            keep.mkdir(parents=True, exist_ok=True)
            for i, p in enumerate(parts):
                name = f"{workload}.{_file_name(contenders[i // 2])}.{1 + 2 * (i % 2)}"
                shutil.copy(p, keep / name)
    return per_call(counts, contenders, calls, workload)


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
