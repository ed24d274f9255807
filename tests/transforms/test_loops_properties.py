"""``treeclone.scan`` and ``fori_loop`` under ``alias`` on random trees of every container kind
(``tests/support/mutation_programs.py``: dicts of each kind, lists, tuples, a dataclass with a
dropped field, a class with state outside its pytree), with a random body that updates the
leaves of some containers in place, or one that builds a new carry: every one of the caller's
containers ends as in the plain Python loop run un-transformed on a deep copy (NumPy leaves),
and the carry returned is what that loop returns (the caller's same objects where the body
updated in place). Under ``strict`` the caller is untouched and the values are the same. Random
trees as ``xs``, their slices changed in place, end under ``alias`` as the Python loop over
views of the stack leaves them (rule L7), and as they were under ``clone``."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation_programs import Model, Noted, containers, describe, sorted_view, trees

# Each example traces and compiles: a fraction of the profile's budget, scaled with it
# (25 under ci; tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
XS = np.arange(1.0, 4.0, dtype=np.float32)


def is_leaf(c):
    return not isinstance(c, (dict, list, tuple, Noted, Model))


def in_place_body(chosen):
    """A body that replaces each leaf child of the chosen containers (by position among the
    carry's containers) with ``leaf * 0.5 + x``, in place, and returns the carry."""

    def body(carry, x):
        found = containers(carry)
        for i in chosen:
            if not found:
                break
            node = found[i % len(found)]
            if isinstance(node, Noted):
                node.x = node.x * 0.5 + x if is_leaf(node.x) else node.x
            elif isinstance(node, Model):
                node.w = node.w * 0.5 + x if is_leaf(node.w) else node.w
            else:
                for key in list(node) if isinstance(node, dict) else range(len(node)):
                    if is_leaf(node[key]):
                        node[key] = node[key] * 0.5 + x
        return carry, None

    return body


def python_loop(body, carry):
    for x in XS:
        carry, _ = body(carry, x)
    return carry


def states(tree, index):
    return [describe(node, index) for node in containers(tree)]


@SETTINGS
@given(tree=trees, chosen=st.lists(st.integers(0, 20), max_size=4))
def test_alias_in_place_scan_is_the_python_loop(tree, chosen):
    tree = sorted_view(tree)  # the body sees dicts sorted (rule J9); so does the reference
    twin = copy.deepcopy(tree)
    index = {id(n): i for i, n in enumerate(containers(tree))}
    twin_index = {id(n): i for i, n in enumerate(containers(twin))}
    body = in_place_body(chosen)
    out, _ = tc.scan(body, tree, XS, policy="alias")
    twin_out = python_loop(body, twin)
    assert out is tree and twin_out is twin
    assert states(tree, index) == states(twin, twin_index)


@SETTINGS
@given(tree=trees, chosen=st.lists(st.integers(0, 20), max_size=4))
def test_alias_fori_loop_and_strict_scan_agree_with_python(tree, chosen):
    tree = sorted_view(tree)
    body = in_place_body(chosen)
    before_index = {id(n): i for i, n in enumerate(containers(tree))}
    before = states(tree, before_index)
    strict_out, _ = tc.scan(body, tree, XS, policy="strict")
    assert states(tree, before_index) == before  # strict writes nothing back
    twin = python_loop(body, copy.deepcopy(tree))
    for a, b in zip(jax.tree.leaves(strict_out), jax.tree.leaves(twin), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)

    def fori_body(i, carry):
        return body(carry, jnp.asarray(XS)[i])[0]

    assert tc.fori_loop(0, len(XS), fori_body, tree, policy="alias") is tree
    index = {id(n): i for i, n in enumerate(containers(tree))}
    twin_index = {id(n): i for i, n in enumerate(containers(twin))}
    assert states(tree, index) == states(twin, twin_index)


@SETTINGS
@given(tree=trees)
def test_alias_functional_scan_leaves_the_caller_and_returns_new_containers(tree):
    tree = sorted_view(tree)

    def body(carry, x):
        return jax.tree.map(lambda v: v * 0.5 + x, carry), None

    index = {id(n): i for i, n in enumerate(containers(tree))}
    before = states(tree, index)
    out, _ = tc.scan(body, tree, XS, policy="alias")
    twin = python_loop(body, copy.deepcopy(tree))
    assert states(tree, index) == before
    assert not ({id(n) for n in containers(out)} & set(index)) or not containers(tree)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(twin), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def slice_body(chosen):
    """A scan body that replaces each leaf child of the chosen containers of its slice (by
    position among the slice's containers) with ``2 * leaf + 1`` in place (exact in float32,
    so NumPy and XLA agree to the bit), and counts its calls in the carry."""

    def body(carry, x):
        found = containers(x)
        for i in chosen:
            if not found:
                break
            node = found[i % len(found)]
            if isinstance(node, Noted):
                node.x = node.x * 2 + 1 if is_leaf(node.x) else node.x
            elif isinstance(node, Model):
                node.w = node.w * 2 + 1 if is_leaf(node.w) else node.w
            else:
                for key in list(node) if isinstance(node, dict) else range(len(node)):
                    if is_leaf(node[key]):
                        node[key] = node[key] * 2 + 1
        carry["n"] = carry["n"] + 1
        return carry, None

    return body


ROWS = 2  # the generated leaves have shape (2,): the stack's rows


def python_scan_over_views(body, carry, xs, reverse):
    """The loop of docs/semantics.md, "scan, fori_loop and while_loop": the slice is row i of
    each leaf, and what the body leaves in it is written back into that row."""
    for i in range(ROWS - 1, -1, -1) if reverse else range(ROWS):
        x = jax.tree.map(lambda a, i=i: a[i], xs)
        carry, _ = body(carry, x)
        for a, row in zip(jax.tree.leaves(xs), jax.tree.leaves(x), strict=True):
            a[i] = row
    return carry


@SETTINGS
@given(tree=trees, chosen=st.lists(st.integers(0, 20), max_size=4), reverse=st.booleans())
def test_alias_scan_writes_slices_back_into_xs_as_the_python_loop_over_views(tree, chosen, reverse):
    xs = sorted_view(tree)  # the body sees dicts sorted (rule J9); so does the reference
    twin = copy.deepcopy(xs)
    index = {id(n): i for i, n in enumerate(containers(xs))}
    twin_index = {id(n): i for i, n in enumerate(containers(twin))}
    body = slice_body(chosen)
    before = states(xs, index)

    out, _ = tc.scan(body, {"n": 0}, copy.deepcopy(xs), length=ROWS, reverse=reverse)
    assert int(out["n"]) == ROWS  # clone: JAX's loop, xs as it was
    assert states(xs, index) == before

    state = {"n": 0}
    assert tc.scan(body, state, xs, length=ROWS, reverse=reverse, policy="alias")[0] is state
    python_scan_over_views(body, {"n": 0}, twin, reverse)
    assert int(state["n"]) == ROWS
    assert states(xs, index) == states(twin, twin_index)
