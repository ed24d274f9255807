"""Concurrency: 8 threads using treeclone.tree_util while another registers new node types.

The workload lives in ``thread_workload.py`` (see its docstring); it runs in a subprocess so that
a crash or a deadlock fails this test instead of killing pytest: every thread joins with a
timeout, ``faulthandler`` dumps every stack and exits if the process is still alive well after
that, and the subprocess itself has a timeout. ``TREECLONE_LONG=1`` runs it for a minute.

To add work (e.g. calling jitted functions), pass callables through ``extra``, as
``test_threads_with_extra_work`` does.
"""

from __future__ import annotations

import ast

from helpers import LONG, run_script

SECONDS = 60 if LONG else 10
OPS = ("flatten", "unflatten", "tree_map", "compare", "flatten_up_to", "with_path")


def _run_workload(setup: str, call: str) -> dict:
    out = run_script(
        f"""
import faulthandler
faulthandler.dump_traceback_later({SECONDS + 60}, exit=True)
import thread_workload
{setup}
counts = {call}
faulthandler.cancel_dump_traceback_later()
print("COUNTS", dict(counts))
""",
        timeout=SECONDS + 120,
    )
    line = next(x for x in out.splitlines() if x.startswith("COUNTS "))
    counts = ast.literal_eval(line[len("COUNTS ") :])
    print(counts)
    return counts


def test_threads_match_jax_while_types_are_registered():
    counts = _run_workload("", f"thread_workload.run(threads=8, seconds={SECONDS})")
    for op in (*OPS, "random_dict", "fresh_type"):
        assert counts.get(op, 0) > 0, (op, counts)
    assert counts["registrations"] >= 10, counts


def test_threads_with_extra_work():
    counts = _run_workload(
        """
import pickle
import trees
import numpy as np

tree = {"w": np.ones(3), "layers": [(1, 2.0), {"b": None, "a": [3]}], "p": trees.Point(1, 2)}
expected = jtu.tree_structure(tree)

def pickle_round_trip():
    td = tc.tree_structure(tree)
    assert pickle.loads(pickle.dumps(td)) == td
    assert td.to_jax() == expected

def children_and_compose():
    td = tc.tree_structure(tree)
    assert tc.treedef_tuple(td.children()).num_leaves == td.num_leaves
    assert td.compose(tc.tree_structure((0, 0))).num_leaves == 2 * td.num_leaves
""",
        f"thread_workload.run(extra=[pickle_round_trip, children_and_compose], threads=8, "
        f"seconds={max(3, SECONDS // 3)})",
    )
    assert counts.get("extra", 0) > 0, counts


def test_threads_calling_jitted_functions_under_every_policy():
    """The issue's full mix: jitted calls (clone, alias write-back, strict errors) in 8 threads
    alongside the tree operations and the registering thread."""
    counts = _run_workload(
        """
import jax
import jax.numpy as jnp
import treeclone

def step(state, x):
    state["w"] = state["w"] + x
    state["n"] = state["n"] + 1
    return state["w"].sum()

clone_step = treeclone.jit(step)
alias_step = treeclone.jit(step, policy="alias")
strict_step = treeclone.jit(step, policy="strict")

def jitted_calls():
    x = jnp.ones(3)
    state = {"w": jnp.zeros(3), "n": jnp.zeros((), jnp.int32)}
    assert float(clone_step(state, x)) == 3.0 and float(state["n"]) == 0
    for k in range(1, 4):
        assert float(alias_step(state, x)) == 3.0 * k and int(state["n"]) == k
    try:
        strict_step(state, x)
    except treeclone.MutationError as e:
        assert "state['n']" in str(e)
    else:
        raise AssertionError("strict did not raise")
""",
        f"thread_workload.run(extra=[jitted_calls], threads=8, seconds={max(3, SECONDS // 3)})",
    )
    assert counts.get("extra", 0) > 0, counts
