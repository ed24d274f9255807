"""Runs the fuzzer (tests/support/fuzz_tree.py) for a few seconds in a subprocess.

``TREECLONE_LONG=1`` runs each driver for minutes instead. The atheris test is skipped where
atheris is not installed (it is in the ``test`` extra on Linux x86_64 for CPython < 3.14, the
platforms it has wheels for); the hypothesis driver needs nothing more than the test extra.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from helpers import LONG, SUPPORT_DIR, child_env

FUZZ = os.path.join(SUPPORT_DIR, "fuzz_tree.py")
# an input that hits a known divergence (NaN dict keys) when --known-bugs generates them
KNOWN_BUG_INPUT = "040405000305020000000000000000"


def _fuzz(*args: str, seconds: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, FUZZ, *args],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        env=child_env(),
        cwd=SUPPORT_DIR,
    )


def _detail(proc: subprocess.CompletedProcess) -> str:
    return (
        f"exit code {proc.returncode}"
        + (" (killed by a signal: the process crashed)" if proc.returncode < 0 else "")
        + f"\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason="atheris is not installed (pip install atheris; wheels exist for Linux x86_64)",
)
def test_atheris_fuzzing_finds_nothing(tmp_path):
    seconds = 600 if LONG else 10
    corpus = str(tmp_path / "corpus")
    args = ("--driver", "atheris", "--seconds", str(seconds), "--corpus", corpus)
    proc = _fuzz(*args, seconds=seconds)
    assert proc.returncode == 0, _detail(proc)
    done = [line for line in proc.stderr.splitlines() if "DONE" in line or "Done" in line]
    assert done, _detail(proc)
    print("\n".join(done))


def test_hypothesis_fuzzing_finds_nothing():
    seconds = 300 if LONG else 5
    proc = _fuzz("--driver", "hypothesis", "--seconds", str(seconds), seconds=seconds)
    assert proc.returncode == 0, _detail(proc)
    assert "no finding" in proc.stdout, _detail(proc)
    print(proc.stdout.strip().splitlines()[-1])


def test_a_finding_fails_with_a_reproducer():
    ok = _fuzz("--replay", KNOWN_BUG_INPUT, seconds=30)
    assert ok.returncode == 0 and "no finding" in ok.stdout, _detail(ok)
    found = _fuzz("--known-bugs", "--replay", KNOWN_BUG_INPUT, seconds=30)
    assert found.returncode != 0, _detail(found)
    assert "==== FINDING ====" in found.stderr and "--replay" in found.stderr, _detail(found)
