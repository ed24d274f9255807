"""Property-based differential tests: hypothesis-generated pytrees, treeclone vs JAX.

Profiles (tests/support/profiles.py): ``ci`` (default), or ``long`` with ``TREECLONE_LONG=1``
or ``TREECLONE_HYPOTHESIS_PROFILE=long``; these run the profile's whole budget.
"""

from __future__ import annotations

import collections
import pickle
from typing import Any

import jax.tree_util as jtu
import numpy as np
import treeclone.tree_util as tc
from helpers import assert_same_objects, assert_same_tree
from hypothesis import given
from hypothesis import strategies as st
from trees import (
    BagJ,
    BagT,
    DataJ,
    DataT,
    KeyBagT,
    KeyedJ,
    LateDataJ,
    LatePairJ,
    Opaque,
    Outer,
    PairJ,
    PairT,
    PairWithKeysT,
    Point,
    Rec,
    StaticJ,
    StaticT,
)

# ---- leaves --------------------------------------------------------------------------------

small_arrays = st.builds(
    lambda n, dtype: np.arange(n, dtype=dtype),
    st.integers(0, 3),
    st.sampled_from([np.float32, np.int64]),
)

leaves = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.booleans(),
    small_arrays,
    st.builds(Opaque, st.integers(0, 5)),
    st.none(),  # None is a node with no children, not a leaf
)

str_keys = st.text(alphabet="abcxyz", min_size=1, max_size=3)
int_keys = st.integers(-5, 5)
metas = st.sampled_from(["m0", "m1"])


def _dicts(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[Any, Any]]:
    # one key type per dict so that the keys are sortable
    return st.one_of(
        st.dictionaries(str_keys, children, max_size=4),
        st.dictionaries(int_keys, children, max_size=4),
    )


def _ordered(d: dict[Any, Any]) -> collections.OrderedDict[Any, Any]:
    return collections.OrderedDict(reversed(list(d.items())))


def _default(d: dict[Any, Any]) -> collections.defaultdict[Any, Any]:
    return collections.defaultdict(list, d)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        _dicts(children),
        _dicts(children).map(_ordered),
        _dicts(children).map(_default),
        st.builds(Point, children, children),
        st.builds(Outer, children, children, children),
        st.builds(PairJ, children, children, meta=metas),
        st.builds(PairT, children, children, meta=metas),
        st.builds(PairWithKeysT, children, children),
        st.builds(KeyedJ, children, children, meta=metas),
        st.builds(LatePairJ, children, children),
        st.builds(BagJ, st.lists(children, max_size=3), name=metas),
        st.builds(BagT, st.lists(children, max_size=3)),
        st.builds(KeyBagT, st.lists(children, max_size=3)),
        st.builds(DataJ, children, children, name=metas, size=st.integers(0, 2)),
        st.builds(DataT, children, children, activation=metas),
        st.builds(LateDataJ, children, children),
        st.builds(StaticJ, st.integers(0, 2)),
        st.builds(StaticT, metas),
    )


pytrees = st.recursive(leaves, _extend, max_leaves=25)


def _is_list(x: Any) -> bool:
    return isinstance(x, list)


def _is_tuple(x: Any) -> bool:
    return isinstance(x, tuple)


is_leaf_options = st.sampled_from([None, _is_list, _is_tuple])


# ---- properties -----------------------------------------------------------------------------


@given(pytrees, is_leaf_options)
def test_flatten_matches_jax(tree, is_leaf):
    tc_leaves, tc_def = tc.tree_flatten(tree, is_leaf=is_leaf)
    jax_leaves, jax_def = jtu.tree_flatten(tree, is_leaf=is_leaf)
    assert_same_objects(tc_leaves, jax_leaves)
    assert repr(tc_def) == repr(jax_def)
    assert tc_def.to_jax() == jax_def
    assert tc.PyTreeDef.from_jax(jax_def) == tc_def
    assert (tc_def.num_leaves, tc_def.num_nodes) == (jax_def.num_leaves, jax_def.num_nodes)
    assert tc_def.node_data() == jax_def.node_data()
    assert [repr(c) for c in tc_def.children()] == [repr(c) for c in jax_def.children()]


@given(pytrees, is_leaf_options)
def test_unflatten_roundtrip_matches_jax(tree, is_leaf):
    tc_leaves, tc_def = tc.tree_flatten(tree, is_leaf=is_leaf)
    jax_leaves, jax_def = jtu.tree_flatten(tree, is_leaf=is_leaf)
    assert_same_tree(tc.tree_unflatten(tc_def, tc_leaves), jtu.tree_unflatten(jax_def, jax_leaves))
    fresh = [Opaque(i) for i in range(jax_def.num_leaves)]
    assert_same_tree(tc_def.unflatten(fresh), jax_def.unflatten(fresh))


@given(pytrees)
def test_tree_map_two_trees_matches_jax(tree):
    jax_def = jtu.tree_structure(tree)
    other = jtu.tree_unflatten(jax_def, [Opaque(i) for i in range(jax_def.num_leaves)])
    assert_same_tree(tc.tree_map(Rec, tree, other), jtu.tree_map(Rec, tree, other))
    assert_same_tree(
        tc.tree_map_with_path(Rec, tree, other), jtu.tree_map_with_path(Rec, tree, other)
    )


@given(pytrees, is_leaf_options)
def test_paths_match_jax(tree, is_leaf):
    tc_pairs, tc_def = tc.tree_flatten_with_path(tree, is_leaf=is_leaf)
    jax_pairs, jax_def = jtu.tree_flatten_with_path(tree, is_leaf=is_leaf)
    assert [p for p, _ in tc_pairs] == [p for p, _ in jax_pairs]
    assert_same_objects([x for _, x in tc_pairs], [x for _, x in jax_pairs])
    assert tc_def.to_jax() == jax_def
    for path, _ in jax_pairs:
        assert tc.keystr(path) == jtu.keystr(path)
        assert tc.keystr(path, simple=True, separator="/") == jtu.keystr(
            path, simple=True, separator="/"
        )


@given(pytrees, pytrees)
def test_treedef_equality_agrees_with_jax(a, b):
    tc_a, tc_b = tc.tree_structure(a), tc.tree_structure(b)
    jax_equal = jtu.tree_structure(a) == jtu.tree_structure(b)
    assert (tc_a == tc_b) == jax_equal
    assert (tc_a != tc_b) == (not jax_equal)
    if jax_equal:
        assert hash(tc_a) == hash(tc_b)


@given(pytrees)
def test_same_structure_different_leaves_equal(tree):
    jax_def = jtu.tree_structure(tree)
    other = jtu.tree_unflatten(jax_def, [Opaque(i) for i in range(jax_def.num_leaves)])
    tc_a, tc_b = tc.tree_structure(tree), tc.tree_structure(other)
    assert tc_a == tc_b
    assert hash(tc_a) == hash(tc_b)
    assert len({tc_a, tc_b}) == 1


@given(pytrees)
def test_flatten_up_to_and_compose_match_jax(tree):
    tc_def, jax_def = tc.tree_structure(tree), jtu.tree_structure(tree)
    deeper = jtu.tree_unflatten(jax_def, [(Opaque(i), [i]) for i in range(jax_def.num_leaves)])
    assert_same_objects(tc_def.flatten_up_to(deeper), jax_def.flatten_up_to(deeper))
    inner = (1, [None, 2])
    composed = tc_def.compose(tc.tree_structure(inner))
    assert composed.to_jax() == jax_def.compose(jtu.tree_structure(inner))


@given(pytrees)
def test_pickle_roundtrip(tree):
    tc_def = tc.tree_structure(tree)
    restored = pickle.loads(pickle.dumps(tc_def))
    assert restored == tc_def
    assert hash(restored) == hash(tc_def)
    assert restored.to_jax() == jtu.tree_structure(tree)


@given(pytrees)
def test_reduce_and_all_leaves_match_jax(tree):
    def collect(acc: list[Any], x: Any) -> list[Any]:
        return [*acc, x]

    assert_same_objects(tc.tree_reduce(collect, tree, []), jtu.tree_reduce(collect, tree, []))
    leaves = jtu.tree_leaves(tree)
    assert tc.all_leaves(leaves) == jtu.all_leaves(leaves)
    assert tc.all_leaves([tree]) == jtu.all_leaves([tree])
