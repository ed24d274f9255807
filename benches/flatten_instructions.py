"""Instructions per identity-tracking flatten (``_native.flatten_shared``, what every
``treeclone.jit`` call under alias or strict runs on its arguments) of flax's overhead model
(the harness's ``nnx_empty`` workloads: ``depth`` Blocks of Linear + BatchNorm in an
``nnx.List``, with its ``nnx.Optimizer``), counted by valgrind's callgrind: a count the
machine's load does not move, for comparing two revisions of the native flatten. No speed
claim is made from it.

    python benches/flatten_instructions.py                 # depths 20 and 100
    python benches/flatten_instructions.py --depth 20 --calls 300

Each depth runs in a child under ``valgrind --tool=callgrind``, counting only inside
``flatten_shared`` (``--toggle-collect``): the model is built, flattened once (the first
flatten of each type checks the native flatten functions against flax's), then flattened
``--calls`` times; the count over the calls is the cost of one.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

TOGGLE = "_native::sharing::__pyfunction_py_flatten_shared"


def flatten_many(depth: int, calls: int) -> None:
    """The child: flax's overhead model and its optimizer, flattened ``calls`` times."""
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from treeclone import _native
    from treeclone.bench.workloads import overhead_model_class

    model = overhead_model_class()(32, depth, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
    tree = ((model, optimizer, jnp.ones((8, 1)), jnp.ones((8, 1))), {})
    _native.flatten_shared(tree)  # counted too: the count is over calls + 1
    for _ in range(calls):
        _native.flatten_shared(tree)


def count(depth: int, calls: int) -> float:
    """Instructions per flatten at ``depth``, from a callgrind run of ``calls + 1`` flattens."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        command += [f"--toggle-collect={TOGGLE}", sys.executable, __file__]
        command += ["--child", "--depth", str(depth), "--calls", str(calls)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        total = re.search(r"Collected : (\d+)", done.stderr) or re.search(
            r"I\s+refs:\s+([\d,]+)", done.stderr
        )
        if total is None:
            raise RuntimeError(f"no count in valgrind's output:\n{done.stderr[-2000:]}")
        return int(total.group(1).replace(",", "")) / (calls + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, action="append", help="default: 20 and 100")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    depths = args.depth or [20, 100]
    if args.child:
        flatten_many(depths[0], args.calls)
        return
    if shutil.which("valgrind") is None:
        sys.exit("flatten_instructions.py needs valgrind")
    for depth in depths:
        per_call = count(depth, args.calls)
        print(f"nnx_empty_{depth}: {per_call / 1000:,.1f} thousand instructions a flatten")


if __name__ == "__main__":
    main()
