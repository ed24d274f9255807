"""``treeclone.cond(policy="alias")`` on random trees of every container kind with random
mutation programs in its branches (``tests/support/mutation_programs.py``), against the plain
Python ``if`` run on a deep copy (``run_as_alias``: the function sees dicts sorted, rule J9):

* the same program of any kind (set, add, delete, append, pop, detach, re-attach) in both
  branches, which return different values: the caller's containers end as plain Python leaves
  them and the result is the taken branch's;
* two different programs that set existing places only, one per branch: when both leave the
  caller's containers with the same shape (the same kinds of children at the same places),
  the taken one's writes reach the caller, the other's do not, although every branch outputs
  the union of the places written; when one replaces a container by an array and the other
  does not, the call is the ValueError naming where, and the caller is untouched.

Each runs eagerly (concrete predicate: the taken branch's own plan) and inside
``treeclone.jit`` with a traced predicate (the joined plan).
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation_programs import (
    containers,
    describe,
    keys,
    programs,
    run_as_alias,
    run_program,
    sorted_view,
    trees,
)

# Each example traces and compiles: a fraction of the profile's budget, scaled with it
# (25 under ci; tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

setting_programs = st.lists(
    st.tuples(st.integers(0, 50), st.just("set"), keys), min_size=1, max_size=4
)


def branch(program, sign):
    def f(tree):
        run_program(tree, program)
        leaves = jax.tree.leaves(tree)
        return sign * (jnp.zeros(()) + sum(jnp.sum(x) * (i + 1) for i, x in enumerate(leaves)))

    return f


def shape_after(tree, program):
    """What each of ``tree``'s containers holds after ``program`` (plain Python on a copy,
    seen as the function sees it: dicts sorted), without the values: the kind of each child
    (a container, by index, or an array's shape) and whether the container is still
    reachable."""
    mine = sorted_view(tree)
    nodes = containers(mine)
    index = {id(n): i for i, n in enumerate(nodes)}
    run_program(mine, program)
    reachable = {id(n) for n in containers(mine)}
    shape = []
    for node in nodes:
        state = describe(node, index)
        state["children"] = [
            c if isinstance(c, tuple) else np.asarray(c).shape for c in state["children"]
        ]
        shape.append((state, id(node) in reachable))
    return shape


def _check(tree, true_program, false_program, pred, traced):
    true_fun, false_fun = branch(true_program, 1.0), branch(false_program, -1.0)
    expected = copy.deepcopy(tree)
    expected_nodes = containers(expected)
    expected_index = {id(n): i for i, n in enumerate(expected_nodes)}
    taken = true_program if pred else false_program
    want_value = branch(taken, 1.0 if pred else -1.0)(sorted_view(tree))
    run_as_alias(expected, taken)

    mine = copy.deepcopy(tree)
    mine_nodes = containers(mine)
    mine_index = {id(n): i for i, n in enumerate(mine_nodes)}
    if shape_after(tree, true_program) != shape_after(tree, false_program):
        before = [describe(n, mine_index) for n in mine_nodes]
        with pytest.raises(ValueError, match="leave different structures"):
            if traced:
                tc.jit(lambda p, t: tc.cond(p, true_fun, false_fun, t, policy="alias"))(pred, mine)
            else:
                tc.cond(pred, true_fun, false_fun, mine, policy="alias")
        assert [describe(n, mine_index) for n in mine_nodes] == before
        return
    if traced:
        step = tc.jit(
            lambda p, t: tc.cond(p, true_fun, false_fun, t, policy="alias"), policy="alias"
        )
        value = step(jnp.asarray(pred), mine)
    else:
        value = tc.cond(pred, true_fun, false_fun, mine, policy="alias")

    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    for got_node, want_node in zip(mine_nodes, expected_nodes, strict=True):
        got, wanted = describe(got_node, mine_index), describe(want_node, expected_index)
        assert got == wanted, (true_program, false_program, pred, traced, got, wanted)


@SETTINGS
@given(trees, programs, st.booleans(), st.booleans())
def test_alias_cond_with_one_program_in_both_branches_equals_plain_python(
    tree, program, pred, traced
):
    _check(tree, program, program, pred, traced)


@SETTINGS
@given(trees, setting_programs, setting_programs, st.booleans(), st.booleans())
def test_alias_cond_with_a_setting_program_per_branch_equals_plain_python(
    tree, true_program, false_program, pred, traced
):
    _check(tree, true_program, false_program, pred, traced)
