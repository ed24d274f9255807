"""Property tests of the policies: random trees, random in-place mutations.

For each generated (tree, mutation program): plain Python applies the program to a deep copy;
under ``alias`` (jitted and eager) the caller's tree must end up equal to it, key order
included (rule J9's order: ``run_as_alias``); under ``strict`` the error must name every
container the program changed; under ``clone`` the caller's tree must be untouched. The
identity-tracking flatten must agree with ``jax.tree_util`` on trees without sharing and
restore sharing on unflatten.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treeclone import _native

leaf = st.integers(0, 9).map(lambda i: np.full((2,), float(i), dtype=np.float32))
keys = st.sampled_from(["a", "b", "c", "d", "e"])
trees = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(keys, inner, max_size=4),
        st.tuples(inner, inner),
    ),
    max_leaves=12,
).filter(lambda t: isinstance(t, (dict, list)))

OPS = ["set", "add", "delete", "append", "pop"]
programs = st.lists(st.tuples(st.integers(0, 50), st.sampled_from(OPS), keys), max_size=5)


def containers(tree, path=""):
    """Mutable containers in a fixed order, with their paths as keystr would write them."""
    out = []
    agenda = [(tree, path)]
    while agenda:
        node, p = agenda.pop(0)
        if isinstance(node, dict):
            out.append((node, p))
            agenda.extend((node[k], f"{p}[{k!r}]") for k in sorted(node))
        elif isinstance(node, list):
            out.append((node, p))
            agenda.extend((v, f"{p}[{i}]") for i, v in enumerate(node))
        elif isinstance(node, tuple):
            agenda.extend((v, f"{p}[{i}]") for i, v in enumerate(node))
    return out


def first_leaf(tree):
    leaves = jax.tree.leaves(tree)
    return leaves[0] if leaves else jnp.zeros(2)


def run_program(tree, program):
    """Apply the mutation program to ``tree`` in place; return the paths it changed."""
    changed = set()
    for choice, op, key in program:
        found = containers(tree, "t")
        node, path = found[choice % len(found)]
        value = first_leaf(tree) + 1
        if isinstance(node, dict):
            if op in ("set", "append") and node:
                node[sorted(node)[choice % len(node)]] = value
            elif op in ("add", "pop") and key not in node:
                node[key] = value
            elif op == "delete" and key in node:
                del node[key]
            else:
                continue
        else:
            if op == "set" and node:
                node[choice % len(node)] = value
            elif op in ("append", "add"):
                node.append(value)
            elif op in ("pop", "delete") and node:
                node.pop()
            else:
                continue
        changed.add(path)
    return changed


def run_as_alias(tree, program):
    """``run_program`` as a call under alias leaves ``tree``: each dict keeps the keys the
    program kept in their places (one deleted and added back too), its new keys after them in
    the order the program added them (docs/semantics.md, rule J8)."""
    dicts = [(node, list(node)) for node, _ in containers(tree) if isinstance(node, dict)]
    run_program(tree, program)
    for d, order in dicts:
        keys = [k for k in order if k in d] + [k for k in d if k not in order]
        items = [(k, d[k]) for k in keys]
        d.clear()
        d.update(items)


def sort_dicts(tree):
    """A copy of ``tree``'s containers (same leaves) with every dict's keys in sorted order."""
    if isinstance(tree, dict):
        return {k: sort_dicts(tree[k]) for k in sorted(tree)}
    if isinstance(tree, (list, tuple)):
        return type(tree)(sort_dicts(x) for x in tree)
    return tree


def contents(node):
    if isinstance(node, dict):
        return tuple((k, id(v)) for k, v in sorted(node.items()))
    return tuple(id(v) for v in node)


def net_changes(tree, program):
    """Paths of the containers of ``tree`` whose contents ``program`` changes (net)."""
    probe = copy.deepcopy(tree)
    before = containers(probe, "t")  # these hold every original object alive: ids stay unique
    alive = jax.tree.leaves(probe)
    shapes = {id(node): (path, contents(node)) for node, path in before}
    run_program(probe, program)
    now = {id(node): contents(node) for node, _ in containers(probe, "t")}
    changed = {path for key, (path, shape) in shapes.items() if key in now and now[key] != shape}
    del alive
    return changed


def mutator(program):
    """A function that applies ``program`` to its argument and returns nothing."""

    def f(t):
        run_program(t, program)

    return f


def assert_same_tree(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for (ca, _), (cb, _) in zip(containers(a), containers(b), strict=True):
        if isinstance(ca, dict):
            assert list(ca) == list(cb)


# Example counts come from the hypothesis profile (tests/conftest.py: "ci" or "long").
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trees, programs)
def test_alias_writeback_equals_plain_python(tree, program):
    expected = copy.deepcopy(tree)
    run_as_alias(expected, program)
    f = mutator(program)
    for runner in (
        lambda t: tc.jit(f, policy="alias")(t),
        lambda t: tc.call(f, t, policy="alias"),
    ):
        mine = copy.deepcopy(tree)
        runner(mine)
        assert_same_tree(mine, expected)


@SETTINGS
@given(trees, programs)
def test_strict_reports_every_mutated_container(tree, program):
    changed = net_changes(tree, program)
    before = copy.deepcopy(tree)

    def f(t):
        run_program(t, program)
        return 0

    if not changed:
        tc.jit(f, policy="strict")(tree)
        return
    with pytest.raises(tc.MutationError) as info:
        tc.jit(f, policy="strict")(tree)
    message = str(info.value)
    reported = {line.strip().split(":")[0] for line in message.splitlines()[1:-1]}
    for path in changed:
        # a container is reported itself (resized, key added) or through a replaced child
        assert any(r == path or r.startswith(path + "[") for r in reported), (path, message)
    assert_same_tree(tree, before)


@SETTINGS
@given(trees, programs)
def test_clone_never_touches_the_caller(tree, program):
    before = copy.deepcopy(tree)
    tc.jit(mutator(program))(tree)
    tc.call(mutator(program), tree)
    assert_same_tree(tree, before)


@SETTINGS
@given(trees)
def test_flatten_shared_agrees_with_jax_without_sharing(tree):
    leaves, sdef, _ = _native.flatten_shared(tree)
    jax_leaves = jax.tree.leaves(tree)
    # The same objects, each once; in JAX's order once dicts are sorted (flatten_shared keeps
    # their insertion order).
    distinct = list({id(x): x for x in jax_leaves}.values())
    assert sorted(map(id, leaves)) == sorted(map(id, distinct))
    in_jax_order = _native.flatten_shared(sort_dicts(tree))[0]
    assert all(a is b for a, b in zip(in_jax_order, distinct, strict=True))
    rebuilt = sdef.unflatten(leaves)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(tree)
    assert _native.flatten_shared(rebuilt)[1] == sdef
    assert hash(_native.flatten_shared(rebuilt)[1]) == hash(sdef)


@SETTINGS
@given(trees, st.integers(0, 50))
def test_flatten_shared_restores_sharing(tree, choice):
    found = containers(tree)
    shared = found[choice % len(found)][0]
    pair = {"x": shared, "y": [shared], "leaf": first_leaf(tree)}
    pair["z"] = pair["leaf"]
    leaves, sdef, _ = _native.flatten_shared(pair)
    assert len(leaves) == len({id(x) for x in jax.tree.leaves(pair)})
    rebuilt = sdef.unflatten(leaves)
    assert rebuilt["x"] is rebuilt["y"][0]
    assert rebuilt["leaf"] is rebuilt["z"]
    assert jax.tree.structure(rebuilt) == jax.tree.structure(pair)
