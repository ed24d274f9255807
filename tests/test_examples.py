"""The scripts in ``examples/`` and the Python code in README.md, run as a newcomer would.

Each example script runs in a fresh interpreter from the repository root and must exit 0 and
print its key lines (the scripts also assert their own claims). In README.md, a Python block
preceded by ``<!-- excerpt: examples/NAME.py -->`` must be an excerpt of that script (its lines
appear there in the same order), and every other Python block is run as a script as is.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import child_env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"

# For each example script: lines its output must contain.
EXPECTED = {
    "policies.py": [
        "plain Python: optimizer.count = 1",
        "jax.jit:      optimizer.count = 0 (update lost)",
        "clone:        optimizer.count = 0",
        "alias:        optimizer.count = 1, plain Python's parameters: True",
        "alias:        optimizer.count = 3 after 3 steps",
        "strict:       MutationError: train_step mutated its inputs in place without returning",
        "  model.params: replaced",
        "  optimizer.momentum: replaced",
        "  optimizer.count: replaced",
        "strict:       optimizer.count = 0 (caller untouched)",
        "strict, returned: optimizer.count = 1",
        "with treeclone.policy('alias'): optimizer.count = 1",
    ],
    "flax_nnx.py": [
        "alias: optimizer.step = 5, traced 1 time(s)",
        "alias: model.hidden.kernel is the same Variable: True",
        "alias == nnx.jit (parameters and optimizer state): True",
        "jax.jit: optimizer.step = 0 (update lost)",
    ],
    "optax_loop.py": [
        "functional loop, clone: same as jax.jit: True",
        "functional loop, alias: same as jax.jit: True",
        "functional loop, strict: same as jax.jit: True",
        "in-place loop, alias: same as jax.jit's functional loop: True",
        "in-place loop, alias: the caller's params dict, updated: True",
        "in-place loop, alias: adam step count = 5",
    ],
    "equinox_modules.py": [
        "non-array leaves of the MLP: ['custom_jvp', 'function']",
        "jax.jit: TypeError: a custom_jvp passed at path model.activation",
        "clone: TypeError: a custom_jvp passed at path model.activation",
        "alias: TypeError: a custom_jvp passed at path model.activation",
        "strict: TypeError: a custom_jvp passed at path model.activation",
        "partitioned loop, clone: same as eqx.filter_jit: True, traced 1 time(s)",
        "partitioned loop, alias: same as eqx.filter_jit: True, traced 1 time(s)",
        "partitioned loop, strict: same as eqx.filter_jit: True, traced 1 time(s)",
        "traced='arrays', clone: same as eqx.filter_jit: True, activation kept: True",
        "traced='arrays', alias: same as eqx.filter_jit: True, activation kept: True",
        "traced='arrays', strict: same as eqx.filter_jit: True, activation kept: True",
        "scan, clone: same as eqx.partition around jax.lax.scan: True, kept: True",
        "scan, alias: same as eqx.partition around jax.lax.scan: True, kept: True",
        "scan, strict: same as eqx.partition around jax.lax.scan: True, kept: True",
    ],
    "equinox_port.py": [
        "clone: same as equinox: True, static fields kept: True, compiled 1 time(s)",
        "alias: same as equinox: True, static fields kept: True, compiled 1 time(s)",
        "strict: same as equinox: True, static fields kept: True, compiled 1 time(s)",
    ],
    "nnx_port.py": [
        "alias: same as nnx (losses, every Variable, optimizer state): True",
        "alias: calls 5, optimizer step 5",
        "alias: the shared Linear is still one object: True",
        "alias: compiled 1 time(s)",
    ],
}

OUTPUT = re.compile(r"<!-- output: (examples/[\w.]+) -->\s*\n```text\n(.*?)```", re.S)
EXCERPT = re.compile(r"<!-- excerpt: (examples/[\w.]+) -->\s*\n```python\n(.*?)```", re.S)
BLOCK = re.compile(r"(<!-- excerpt: [^>]*-->\s*\n)?```python\n(.*?)```", re.S)


def _run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
    )


def test_every_example_has_expectations():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@functools.cache
def _example_output(name: str) -> str:
    """The stdout of ``examples/<name>``, which must exit 0 (run once per test session)."""
    proc = _run([str(EXAMPLES / name)])
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_and_prints_its_claims(name: str):
    stdout = _example_output(name)
    lines = stdout.splitlines()
    for want in EXPECTED[name]:
        found = any(line.startswith(want) for line in lines)
        assert found, f"{name}: no line starting {want!r} in:\n{stdout}"


def test_readme_excerpts_are_taken_from_the_examples():
    text = README.read_text()
    excerpts = EXCERPT.findall(text)
    assert {path for path, _ in excerpts} >= {"examples/policies.py"}
    for path, block in excerpts:
        source = (ROOT / path).read_text().splitlines()
        pos = 0
        for line in block.splitlines():
            if not line.strip():
                continue
            try:
                pos = source.index(line, pos) + 1
            except ValueError:
                pytest.fail(f"README excerpt of {path}: line not found (in order): {line!r}")


def test_readme_output_blocks_are_what_the_examples_print():
    outputs = OUTPUT.findall(README.read_text())
    assert outputs
    for path, block in outputs:
        printed = set(_example_output(Path(path).name).splitlines())
        for line in block.splitlines():
            assert line in printed, f"README shows {line!r}, which {path} does not print"


def test_readme_standalone_python_blocks_run(tmp_path: Path):
    blocks = [code for marker, code in BLOCK.findall(README.read_text()) if not marker]
    assert blocks
    for i, code in enumerate(blocks):
        script = tmp_path / f"readme_block_{i}.py"
        script.write_text(code)
        proc = _run([str(script)])
        assert proc.returncode == 0, f"README block {i} failed:\n{code}\n{proc.stderr}"


def test_readme_links_stay_inside_the_repository():
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
            assert path.exists(), f"{doc.name} links to a missing path: {target}"
