"""``treeclone.value_and_grad(policy="alias")`` on random trees of every container kind, with a
random mutation program run inside the differentiated function (set, add, delete, append,
pop, detach, re-attach; ``tests/support/mutation_programs.py``):

* every one of the caller's containers ends as plain Python leaves its twin (the program run
  un-transformed on a deep copy, NumPy leaves, seeing dicts sorted as the function does:
  ``run_as_alias``, rule J9);
* the value is plain Python's on that sorted view;
* the gradient equals ``jax.grad`` of the functional version: the same program on a copy of
  the sorted view rebuilt around the traced leaves, compared leaf by leaf at the same key
  paths.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from mutation_programs import (
    Model,
    Noted,
    containers,
    describe,
    programs,
    run_as_alias,
    run_program,
    sorted_view,
    trees,
)

# Each example traces and compiles: a fraction of the profile's budget, scaled with it
# (30 under ci; tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def loss_after(program):
    def f(tree):
        run_program(tree, program)
        leaves = jax.tree.leaves(tree)
        return jnp.zeros(()) + sum(jnp.sum(x) * (i + 1) for i, x in enumerate(leaves))

    return f


def _children_with_keys(node):
    """``(key entry, child)`` for each child of ``node``, in the caller's order: a dict's
    items in its own order, other nodes as JAX keys them."""
    if isinstance(node, dict) and type(node).__module__ != "node_kinds":
        return [((jax.tree_util.DictKey(k),), v) for k, v in node.items()]
    return jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda c: c is not node)[0]


def caller_order(tree, prefix=()):
    """``(key path, leaf)`` for every leaf of ``tree``, each dict in its own order (a sorted
    view's: the order the function sees under alias)."""
    if isinstance(tree, np.ndarray):
        return [(prefix, tree)]
    found = []
    for path, child in _children_with_keys(tree):
        found.extend(caller_order(child, prefix + tuple(path)))
    return found


def fill(tree, values):
    """``tree`` (a fresh copy) with its leaves replaced, in caller order, by ``values``."""
    if isinstance(tree, np.ndarray):
        return next(values)
    if isinstance(tree, tuple):
        return tuple(fill(c, values) for c in tree)
    if isinstance(tree, dict):
        for k in list(tree):
            tree[k] = fill(tree[k], values)
    elif isinstance(tree, list):
        for i in range(len(tree)):
            tree[i] = fill(tree[i], values)
    elif isinstance(tree, Noted):
        tree.x = fill(tree.x, values)
    elif isinstance(tree, Model):
        tree.w = fill(tree.w, values)
    return tree


@SETTINGS
@given(trees, programs)
def test_alias_grad_equals_plain_python_and_jax_grad(tree, program):
    f = loss_after(program)
    expected = copy.deepcopy(tree)
    expected_nodes = containers(expected)
    expected_index = {id(n): i for i, n in enumerate(expected_nodes)}
    run_as_alias(expected, program)
    view = sorted_view(tree)
    expected_value = f(copy.deepcopy(view))

    paths, leaves = zip(*caller_order(view), strict=True) if caller_order(view) else ((), ())
    reference = jax.grad(lambda vals: f(fill(copy.deepcopy(view), iter(vals))))(list(leaves))
    want = {jax.tree_util.keystr(p): g for p, g in zip(paths, reference, strict=True)}

    mine = copy.deepcopy(tree)
    mine_nodes = containers(mine)
    value, grads = tc.value_and_grad(f, policy="alias")(mine)

    np.testing.assert_allclose(value, expected_value, rtol=1e-6)
    mine_index = {id(n): i for i, n in enumerate(mine_nodes)}
    for got_node, want_node in zip(mine_nodes, expected_nodes, strict=True):
        got, wanted = describe(got_node, mine_index), describe(want_node, expected_index)
        assert got == wanted, (program, got, wanted)
    got_grads = {
        jax.tree_util.keystr(p): g for p, g in jax.tree_util.tree_flatten_with_path(grads)[0]
    }
    assert got_grads.keys() == want.keys()
    for k, g in got_grads.items():
        np.testing.assert_allclose(g, want[k], rtol=1e-6, err_msg=f"{program} at {k}")
