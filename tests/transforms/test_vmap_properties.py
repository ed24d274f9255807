"""``treeclone.vmap(policy="alias")`` on random trees of every container kind, with a random
mutation program run inside the mapped function (set, add, delete, append, pop, detach,
re-attach; ``tests/support/mutation_programs.py``), against the Python loop over the batch:

* for each example, the program runs un-transformed on a deep copy of the caller's tree
  whose leaves are that example's slices (NumPy), seeing dicts sorted as the function does
  (``run_as_alias``, rule J9);
* every one of the caller's containers ends as the examples' twins do, with each leaf the
  stack of the examples' leaves along the tree's batch axis (0 or 1), and the same containers
  in the same places.

The programs choose what to change by position, never by value, so every example changes the
same structure (what a vmapped function may do); the values they write are computed from
the example's first leaf, so they differ between examples.
"""

from __future__ import annotations

import copy

import jax
import numpy as np
import profiles
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation_programs import containers, describe, programs, run_as_alias, run_program, trees

# Each example traces and compiles: a fraction of the profile's budget, scaled with it
# (30 under ci; tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
B = 3


def batched(tree, axis):
    """``tree`` with each leaf (shape (2,)) replaced by B different examples of it, stacked
    along ``axis``."""
    return jax.tree.map(
        lambda x: np.stack([x + 10.0 * b for b in range(B)], axis=axis).astype(np.float32), tree
    )


def example(tree, i, axis):
    return jax.tree.map(lambda x: np.take(x, i, axis=axis), copy.deepcopy(tree))


def stacked_description(nodes_per_example, index_per_example, axis):
    """``describe`` of one container across the examples: what they agree on, and each leaf
    child stacked along ``axis``."""
    descriptions = [
        describe(node, index)
        for node, index in zip(nodes_per_example, index_per_example, strict=True)
    ]
    first = dict(descriptions[0])
    for other in descriptions[1:]:
        assert {k: v for k, v in other.items() if k != "children"} == {
            k: v for k, v in first.items() if k != "children"
        }
    children = []
    for j, child in enumerate(first["children"]):
        if isinstance(child, tuple):  # a container: the same one in every example
            assert all(d["children"][j] == child for d in descriptions)
            children.append(child)
        else:
            values = [np.asarray(d["children"][j], np.float32) for d in descriptions]
            children.append(np.stack(values, axis=axis).tolist())
    first["children"] = children
    return first


@SETTINGS
@given(trees, programs, st.sampled_from([0, 1]))
def test_alias_vmap_equals_the_python_loop_over_the_batch(tree, program, axis):
    caller = batched(tree, axis)

    # The loop: each example on its own slice, as plain Python under alias (rule J9).
    examples = [example(caller, i, axis) for i in range(B)]
    nodes = [containers(e) for e in examples]
    indexes = [{id(n): k for k, n in enumerate(ns)} for ns in nodes]
    for e in examples:
        run_as_alias(e, program)

    mine = copy.deepcopy(caller)
    mine_nodes = containers(mine)
    tc.vmap(lambda t: run_program(t, program), axis, axis_size=B, policy="alias")(mine)
    mine_index = {id(n): k for k, n in enumerate(mine_nodes)}
    for k, got_node in enumerate(mine_nodes):
        got = describe(got_node, mine_index)
        want = stacked_description([ns[k] for ns in nodes], indexes, axis)
        assert got == want, (program, axis, got, want)
