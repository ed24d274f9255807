"""treeclone treedefs and jaxlib treedefs together: equality across the two kinds, functions
that take either kind, and jaxlib's remaining treedef methods (each differential: the same
answer as jaxlib's method on the equal jaxlib treedef)."""

from __future__ import annotations

import functools
from typing import Any

import jax.tree_util as jtu
import pytest
import treeclone.tree_util as tc
from helpers import assert_same_outcome
from trees import BIG_IDS, CORPUS_BY_ID, CORPUS_IDS

SMALL_IDS = [i for i in CORPUS_IDS if i not in BIG_IDS and not i.startswith("deep_")]


@functools.cache
def _defs(corpus_id: str) -> tuple[Any, Any]:
    tree = CORPUS_BY_ID[corpus_id]()
    return tc.tree_structure(tree), jtu.tree_structure(tree)


def _equal(got: Any, expected: Any) -> None:
    assert got == expected


def _same_repr(got: Any, expected: Any) -> None:
    assert repr(got) == repr(expected)


@pytest.mark.parametrize("a_id", SMALL_IDS)
def test_equality_with_jaxlib_treedefs_agrees_with_jax(a_id):
    ours_a, jax_a = _defs(a_id)
    wrong = []
    for b_id in SMALL_IDS:
        _, jax_b = _defs(b_id)
        expected = jax_a == jax_b
        if (ours_a == jax_b) != expected or (ours_a != jax_b) == expected:
            wrong.append(f"{a_id} vs jaxlib {b_id}: expected equal={expected}")
    assert not wrong, "\n".join(wrong)


def test_jaxlib_treedef_equality_is_one_way():
    """jaxlib's __eq__ answers False (not NotImplemented) for any other type, so Python never
    asks treeclone's: `jaxlib_def == treeclone_def` is False. Documented in README."""
    ours, theirs = _defs("nested_mixed")
    assert ours == theirs
    try:
        answer = theirs == ours
    except TypeError:  # JAX 0.6, 0.7: jaxlib's __eq__ raises for another type instead
        return
    assert answer is False


@pytest.mark.parametrize("corpus_id", SMALL_IDS)
def test_compose_accepts_a_jaxlib_inner_treedef(corpus_id):
    ours, theirs = _defs(corpus_id)
    inner_tree = {"x": (1, None), "y": [2]}
    inner_jax = jtu.tree_structure(inner_tree)
    assert_same_outcome(
        lambda: ours.compose(inner_jax).to_jax(), lambda: theirs.compose(inner_jax), _equal
    )
    assert ours.compose(inner_jax) == ours.compose(tc.tree_structure(inner_tree))


def test_treedef_tuple_accepts_both_kinds():
    a, b = {"a": 1, "b": [2, 3]}, (None, 4)
    mixed = tc.treedef_tuple([tc.tree_structure(a), jtu.tree_structure(b)])
    assert mixed == jtu.treedef_tuple([jtu.tree_structure(a), jtu.tree_structure(b)])
    with pytest.raises(TypeError, match="expected a PyTreeDef"):
        tc.treedef_tuple([tc.tree_structure(a), "not a treedef"])


@pytest.mark.parametrize("corpus_id", SMALL_IDS)
def test_walk_is_jaxlibs(corpus_id):
    ours, theirs = _defs(corpus_id)

    def f_node(results, node_data):
        return ("node", tuple(results), repr(node_data))

    leaves = list(range(theirs.num_leaves))
    assert_same_outcome(
        lambda: ours.walk(f_node, lambda x: x * 10, leaves),
        lambda: theirs.walk(f_node, lambda x: x * 10, leaves),
        _equal,
    )


@pytest.mark.parametrize("corpus_id", SMALL_IDS)
def test_from_iterable_tree_is_jaxlibs(corpus_id):
    ours, theirs = _defs(corpus_id)
    iterable = theirs.walk(lambda results, _: list(results), lambda x: x, range(theirs.num_leaves))
    assert_same_outcome(
        lambda: ours.from_iterable_tree(iterable),
        lambda: theirs.from_iterable_tree(iterable),
        _same_repr,  # custom nodes lack __eq__
    )


@pytest.mark.skipif(
    not hasattr(jtu.PyTreeDef, "serialize_using_proto"), reason="jaxlib without proto support"
)
@pytest.mark.parametrize("tree", [{"a": [1, 2], "b": (3, None)}, [(), {}, None], 7])
def test_proto_serialization_round_trips_through_jaxlib(tree):
    ours = tc.tree_structure(tree)
    data = ours.serialize_using_proto()
    assert data == jtu.tree_structure(tree).serialize_using_proto()
    back = tc.PyTreeDef.deserialize_using_proto(jtu.default_registry, data)
    assert isinstance(back, tc.PyTreeDef) and back == ours


@pytest.mark.parametrize("corpus_id", SMALL_IDS)
def test_from_node_data_and_children_rebuilds_each_treedef(corpus_id):
    ours, theirs = _defs(corpus_id)
    if theirs.node_data() is None:
        children: list = []
    else:
        children = [*ours.children()[:1], *theirs.children()[1:]]  # both kinds at once
    rebuilt = tc.PyTreeDef.from_node_data_and_children(
        jtu.default_registry, theirs.node_data(), children
    )
    assert rebuilt == ours and rebuilt == theirs


def test_from_node_data_and_children_refuses_another_registry():
    other = type(jtu.default_registry)()
    with pytest.raises(ValueError, match="default registry"):
        tc.PyTreeDef.from_node_data_and_children(other, None, [])
