"""The cycle check (``_native.check``, and ``_native.check_arguments``, which ``clone`` runs
before every ``jax.jit`` call whose arguments hold a container, static ones left out) against
an oracle: hypothesis builds graphs of lists, dicts and registered pairs, with edges that may
be long chains of tuples and containers shared between several parents, and the check must
raise JAX's cycle ValueError exactly when the graph has a cycle. The check looks through a
shared container once and carries its height to the other places it is met: the chains make
trees deeper than the quick look's bound below some of those places and not others."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from treeclone import _native
from trees import PairJ

KINDS = ("list", "dict", "pair")
# Chains of tuples on an edge: 0 (the node itself), short, and long enough that two of them
# pass the quick look's 64 containers.
CHAIN_LENGTHS = (0, 0, 1, 20, 40)


@st.composite
def graphs(draw: Any) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """Nodes (their kinds) and each node's edges: (target node or -1 for a leaf, chain)."""
    n = draw(st.integers(1, 6))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))
    edge = st.tuples(st.integers(-1, n - 1), st.sampled_from(CHAIN_LENGTHS))
    pair_edges, other_edges = st.lists(edge, min_size=2, max_size=2), st.lists(edge, max_size=3)
    edges = [draw(pair_edges if kind == "pair" else other_edges) for kind in kinds]
    return kinds, edges


def build(kinds: list[str], edges: list[list[tuple[int, int]]]) -> list[Any]:
    """The graph's nodes as Python objects (the containers first, then their children)."""
    nodes: list[Any] = [
        [] if kind == "list" else {} if kind == "dict" else PairJ(None, None) for kind in kinds
    ]
    for i, (kind, out) in enumerate(zip(kinds, edges, strict=True)):
        children = []
        for target, chain in out:
            child: Any = 1.0 if target < 0 else nodes[target]
            for _ in range(chain):
                child = (child,)
            children.append(child)
        node = nodes[i]
        if kind == "list":
            node.extend(children)
        elif kind == "dict":
            node.update((f"k{j}", child) for j, child in enumerate(children))
        else:
            node.a, node.b = children
    return nodes


def reaches_a_cycle(edges: list[list[tuple[int, int]]], root: int) -> bool:
    """Whether a cycle is reachable from ``root`` (depth-first, with the path's nodes)."""
    on_path: set[int] = set()
    done: set[int] = set()

    def visit(node: int) -> bool:
        if node in on_path:
            return True
        if node in done:
            return False
        on_path.add(node)
        found = any(visit(target) for target, _ in edges[node] if target >= 0)
        on_path.discard(node)
        done.add(node)
        return found

    return visit(root)


def assert_check_agrees(call: Any, cyclic: bool) -> None:
    if not cyclic:
        call()
        return
    with pytest.raises(ValueError, match="cycle"):
        call()


@given(graphs(), st.data())
def test_the_check_raises_exactly_on_cycles(graph: Any, data: Any) -> None:
    kinds, edges = graph
    nodes = build(kinds, edges)
    root = data.draw(st.integers(0, len(nodes) - 1))
    assert_check_agrees(lambda: _native.check(nodes[root]), reaches_a_cycle(edges, root))
    # Several roots, so that a container is met from more than one of them.
    roots = data.draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, max_size=3))
    cyclic = any(reaches_a_cycle(edges, r) for r in roots)
    args = tuple(nodes[r] for r in roots)
    assert_check_agrees(lambda: _native.check(args), cyclic)
    none = frozenset()
    assert_check_agrees(lambda: _native.check_arguments(args, {}, none, none), cyclic)
    kwargs = {f"a{i}": arg for i, arg in enumerate(args)}
    assert_check_agrees(lambda: _native.check_arguments((), kwargs, none, none), cyclic)
    # Static arguments are never looked at (as jax.jit never flattens them): positions, each
    # given as counted from the start or from the end, and keyword names.
    static = data.draw(st.lists(st.booleans(), min_size=len(roots), max_size=len(roots)))
    from_end = data.draw(st.lists(st.booleans(), min_size=len(roots), max_size=len(roots)))
    nums = frozenset(
        i - len(roots) if end else i
        for i, (is_static, end) in enumerate(zip(static, from_end, strict=True))
        if is_static
    )
    names = frozenset(f"a{i}" for i, is_static in enumerate(static) if is_static)
    dynamic = [r for r, is_static in zip(roots, static, strict=True) if not is_static]
    cyclic = any(reaches_a_cycle(edges, r) for r in dynamic)
    assert_check_agrees(lambda: _native.check_arguments(args, {}, nums, none), cyclic)
    assert_check_agrees(lambda: _native.check_arguments((), kwargs, none, names), cyclic)


def test_a_shared_container_met_shallow_then_deep_is_walked_again() -> None:
    """Met first one container down and then 50 down, a container 30 high makes the tree 80
    deep: past the quick look, so the full walk runs (and finds no cycle); with a cycle below
    the shared container, it names it."""
    shared: Any = {"w": 1.0}
    for _ in range(29):
        shared = [shared]
    deep: Any = shared
    for _ in range(50):
        deep = {"k": deep}
    for tree in ((shared, deep), (deep, shared), [shared, [deep, shared]]):
        _native.check(tree)
        _native.check_arguments(tuple(tree), {}, frozenset(), frozenset())
    loop: dict[str, Any] = {"w": 1.0}
    loop["self"] = [loop]
    for tree in ((loop, loop), ({"a": loop}, [loop]), [[loop], loop], (shared, loop, deep)):
        with pytest.raises(ValueError, match="cycle"):
            _native.check(tree)
