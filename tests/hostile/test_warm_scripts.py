"""``helpers.run_warm``, the hostile tests' way of running a script in a process of its own
(forked from a warm interpreter, ``tests/support/forkserver.py``), must isolate as a fresh
interpreter does: a crash fails that script only, nothing a script does reaches the next,
and a script that hangs is stopped."""

from __future__ import annotations

import subprocess

import pytest
from helpers import run_warm


def test_a_crash_fails_that_script_and_the_next_runs():
    with pytest.raises(AssertionError, match=r"exit code -11 \(killed by a signal"):
        run_warm("import ctypes\nctypes.string_at(0)")
    with pytest.raises(AssertionError, match=r"(?s)exit code -6 .*Fatal Python error: Aborted"):
        run_warm("import os\nos.abort()")
    run_warm("assert tc.tree_leaves([1, (2,)]) == [1, 2]")


def test_each_script_starts_from_the_prelude_alone():
    # What one script imports, registers or sets is gone for the next.
    script = """
import sys
assert "trees" not in sys.modules and "equinox" not in sys.modules
class Node:
    pass
jtu.register_pytree_node(Node, lambda n: ((), None), lambda a, c: Node())
sys.setrecursionlimit(123)
import trees
"""
    run_warm(script)
    run_warm(script)  # the registration again: an error had the first one stayed


def test_exit_codes_output_and_errors_are_a_fresh_interpreters():
    with pytest.raises(AssertionError, match=r"exit code 3\n--- stdout ---\nbefore\n"):
        run_warm("print('before')\nraise SystemExit(3)")
    with pytest.raises(AssertionError, match=r"(?s)exit code 1\n.*ZeroDivisionError"):
        run_warm("1 / 0")
    assert run_warm("print('hello')", marker="DONE").splitlines() == ["hello", "DONE"]


def test_a_script_that_hangs_is_stopped_and_the_next_runs():
    with pytest.raises(subprocess.TimeoutExpired):
        run_warm("import time\ntime.sleep(60)", timeout=1)
    run_warm("pass")
