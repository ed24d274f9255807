"""Differential tests: every corpus tree through treeclone.tree_util vs jax.tree_util."""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu
import pytest
import treeclone.tree_util as tc
from helpers import (
    assert_same_objects,
    assert_same_outcome,
    assert_same_tree,
    same_leaf,
)
from trees import Opaque, Rec


def _fresh_leaves(n: int) -> list[Opaque]:
    return [Opaque(i) for i in range(n)]


# --------------------------------------------------------------------------------------------
# flatten / structure / treedef accessors
# --------------------------------------------------------------------------------------------


def test_flatten_leaves_are_jax_leaves(tree):
    tc_leaves, tc_def = tc.tree_flatten(tree)
    jax_leaves, _ = jtu.tree_flatten(tree)
    assert isinstance(tc_def, tc.PyTreeDef)
    assert_same_objects(tc_leaves, jax_leaves)


def test_tree_leaves_are_jax_leaves(tree):
    assert_same_objects(tc.tree_leaves(tree), jtu.tree_leaves(tree))


def test_treedef_repr_matches_jax(tree):
    _, tc_def = tc.tree_flatten(tree)
    assert repr(tc_def) == repr(jtu.tree_structure(tree))


def test_tree_structure_matches_flatten(tree):
    tc_def = tc.tree_structure(tree)
    assert isinstance(tc_def, tc.PyTreeDef)
    assert tc_def == tc.tree_flatten(tree)[1]
    assert repr(tc_def) == repr(jtu.tree_structure(tree))


def test_to_jax_equals_jax_treedef(tree):
    jax_def = jtu.tree_structure(tree)
    converted = tc.tree_structure(tree).to_jax()
    assert isinstance(converted, jtu.PyTreeDef)
    assert converted == jax_def
    assert repr(converted) == repr(jax_def)


def test_from_jax_equals_treeclone_treedef(tree):
    jax_def = jtu.tree_structure(tree)
    tc_def = tc.tree_structure(tree)
    converted = tc.PyTreeDef.from_jax(jax_def)
    assert isinstance(converted, tc.PyTreeDef)
    assert converted == tc_def
    assert hash(converted) == hash(tc_def)
    assert repr(converted) == repr(jax_def)
    assert converted.to_jax() == jax_def


def test_num_leaves_and_num_nodes(tree):
    tc_def = tc.tree_structure(tree)
    jax_def = jtu.tree_structure(tree)
    assert tc_def.num_leaves == jax_def.num_leaves
    assert tc_def.num_nodes == jax_def.num_nodes


def test_children_match_jax(tree):
    tc_def = tc.tree_structure(tree)
    jax_def = jtu.tree_structure(tree)
    children = tc_def.children()
    jax_children = jax_def.children()
    assert isinstance(children, list)
    assert [repr(c) for c in children] == [repr(c) for c in jax_children]
    for child, jax_child in zip(children, jax_children, strict=True):
        assert isinstance(child, tc.PyTreeDef)
        assert child.to_jax() == jax_child
    assert [repr(c) for c in tc.treedef_children(tc_def)] == [repr(c) for c in jax_children]


def test_node_data_matches_jax(tree):
    assert tc.tree_structure(tree).node_data() == jtu.tree_structure(tree).node_data()


def test_treedef_is_leaf_matches_jax(tree):
    tc_def = tc.tree_structure(tree)
    assert tc.treedef_is_leaf(tc_def) == jtu.treedef_is_leaf(jtu.tree_structure(tree))


# --------------------------------------------------------------------------------------------
# unflatten and friends
# --------------------------------------------------------------------------------------------


def test_unflatten_roundtrip_matches_jax(tree):
    leaves, tc_def = tc.tree_flatten(tree)
    jax_leaves, jax_def = jtu.tree_flatten(tree)
    rebuilt = tc.tree_unflatten(tc_def, leaves)
    expected = jtu.tree_unflatten(jax_def, jax_leaves)
    assert_same_tree(rebuilt, expected)
    assert_same_tree(tc_def.unflatten(leaves), expected)


def test_unflatten_new_leaves_matches_jax(tree):
    tc_def = tc.tree_structure(tree)
    jax_def = jtu.tree_structure(tree)
    new = _fresh_leaves(jax_def.num_leaves)
    assert_same_tree(tc.tree_unflatten(tc_def, new), jtu.tree_unflatten(jax_def, new))


def test_unflatten_accepts_iterables(tree):
    tc_def = tc.tree_structure(tree)
    jax_def = jtu.tree_structure(tree)
    new = _fresh_leaves(jax_def.num_leaves)
    expected = jtu.tree_unflatten(jax_def, new)
    assert_same_tree(tc.tree_unflatten(tc_def, tuple(new)), expected)
    assert_same_tree(tc.tree_unflatten(tc_def, iter(new)), expected)
    assert_same_tree(tc_def.unflatten(x for x in new), expected)


def test_flatten_up_to_matches_jax(tree):
    tc_def = tc.tree_structure(tree)
    jax_def = jtu.tree_structure(tree)
    # Replace every leaf by a subtree: flatten_up_to must stop at the treedef's leaves.
    subtrees = [[Opaque(i), {"x": (i,)}] for i in range(jax_def.num_leaves)]
    bigger = jtu.tree_unflatten(jax_def, subtrees)
    assert_same_objects(tc_def.flatten_up_to(bigger), jax_def.flatten_up_to(bigger))
    assert_same_objects(tc_def.flatten_up_to(tree), jax_def.flatten_up_to(tree))


@pytest.mark.parametrize(
    "inner",
    [1, None, (1, None), [1, {"b": 2, "a": 3}], ()],
    ids=["leaf", "none", "tuple", "nested", "empty"],
)
def test_compose_matches_jax(tree, inner):
    tc_def = tc.tree_structure(tree)
    jax_def = jtu.tree_structure(tree)
    composed = tc_def.compose(tc.tree_structure(inner))
    expected = jax_def.compose(jtu.tree_structure(inner))
    assert isinstance(composed, tc.PyTreeDef)
    assert repr(composed) == repr(expected)
    assert composed.to_jax() == expected
    assert composed.num_leaves == expected.num_leaves
    assert composed.num_nodes == expected.num_nodes


# --------------------------------------------------------------------------------------------
# tree_map / paths
# --------------------------------------------------------------------------------------------


def test_tree_map_single_tree(tree):
    assert_same_tree(tc.tree_map(Rec, tree), jtu.tree_map(Rec, tree))


def test_tree_map_returns_same_values_as_jax(tree):
    def f(x: Any) -> Any:
        return x

    assert_same_tree(tc.tree_map(f, tree), jtu.tree_map(f, tree))


def test_tree_map_three_trees(tree):
    jax_def = jtu.tree_structure(tree)
    second = jtu.tree_unflatten(jax_def, _fresh_leaves(jax_def.num_leaves))
    # the third tree has extra structure below the first tree's leaves (a prefix match)
    third = jtu.tree_unflatten(jax_def, [[Opaque(i)] for i in range(jax_def.num_leaves)])
    assert_same_tree(
        tc.tree_map(Rec, tree, second, third),
        jtu.tree_map(Rec, tree, second, third),
    )


def test_tree_map_call_order_matches_jax(tree):
    seen_tc: list[Any] = []
    seen_jax: list[Any] = []
    tc.tree_map(seen_tc.append, tree)
    jtu.tree_map(seen_jax.append, tree)
    assert_same_objects(seen_tc, seen_jax, "objects passed to f")


def test_tree_map_with_path_single(tree):
    assert_same_tree(tc.tree_map_with_path(Rec, tree), jtu.tree_map_with_path(Rec, tree))


def test_tree_map_with_path_two_trees(tree):
    jax_def = jtu.tree_structure(tree)
    second = jtu.tree_unflatten(jax_def, _fresh_leaves(jax_def.num_leaves))
    assert_same_tree(
        tc.tree_map_with_path(Rec, tree, second),
        jtu.tree_map_with_path(Rec, tree, second),
    )


def test_flatten_with_path_matches_jax(tree):
    tc_pairs, tc_def = tc.tree_flatten_with_path(tree)
    jax_pairs, jax_def = jtu.tree_flatten_with_path(tree)
    assert isinstance(tc_def, tc.PyTreeDef)
    assert tc_def.to_jax() == jax_def
    assert isinstance(tc_pairs, list)
    assert [p for p, _ in tc_pairs] == [p for p, _ in jax_pairs]
    assert all(type(p) is tuple for p, _ in tc_pairs)
    assert_same_objects([x for _, x in tc_pairs], [x for _, x in jax_pairs])


def test_leaves_with_path_matches_jax(tree):
    tc_pairs = tc.tree_leaves_with_path(tree)
    jax_pairs = jtu.tree_leaves_with_path(tree)
    assert [p for p, _ in tc_pairs] == [p for p, _ in jax_pairs]
    assert_same_objects([x for _, x in tc_pairs], [x for _, x in jax_pairs])


def test_path_key_entries_are_jax_classes(tree):
    for path, _ in tc.tree_flatten_with_path(tree)[0]:
        for key in path:
            assert type(key) in (
                jtu.SequenceKey,
                jtu.DictKey,
                jtu.GetAttrKey,
                jtu.FlattenedIndexKey,
            ), f"unexpected key entry type {type(key)}"


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"simple": True}, {"separator": "/"}, {"simple": True, "separator": "."}],
    ids=["default", "simple", "separator", "simple_separator"],
)
def test_keystr_matches_jax(tree, kwargs):
    for path, _ in jtu.tree_flatten_with_path(tree)[0]:
        assert tc.keystr(path, **kwargs) == jtu.keystr(path, **kwargs)
    for path, _ in tc.tree_flatten_with_path(tree)[0]:
        assert tc.keystr(path, **kwargs) == jtu.keystr(path, **kwargs)


# --------------------------------------------------------------------------------------------
# reductions, transpose
# --------------------------------------------------------------------------------------------


def test_tree_reduce_with_initializer(tree):
    def collect(acc: list[Any], x: Any) -> list[Any]:
        return [*acc, x]

    assert_same_objects(tc.tree_reduce(collect, tree, []), jtu.tree_reduce(collect, tree, []))


def test_tree_reduce_without_initializer(tree):
    def make_reducer(calls: list[Any]):
        def keep_last(a: Any, b: Any) -> Any:
            calls.append(a)
            calls.append(b)
            return b

        return keep_last

    tc_calls: list[Any] = []
    jax_calls: list[Any] = []
    assert_same_outcome(
        lambda: tc.tree_reduce(make_reducer(tc_calls), tree),
        lambda: jtu.tree_reduce(make_reducer(jax_calls), tree),
        lambda a, b: assert_same_objects([a], [b], "result"),
    )
    assert_same_objects(tc_calls, jax_calls, "reducer arguments")


def test_tree_all_matches_jax(tree):
    all_true = jtu.tree_map(lambda _: True, tree)
    assert tc.tree_all(all_true) is jtu.tree_all(all_true) is True
    leaves, jax_def = jtu.tree_flatten(tree)
    if leaves:
        one_false = jtu.tree_unflatten(jax_def, [True] * (len(leaves) - 1) + [0])
        assert tc.tree_all(one_false) == jtu.tree_all(one_false)
    assert_same_outcome(lambda: tc.tree_all(tree), lambda: jtu.tree_all(tree), _assert_eq)


def _assert_eq(a: Any, b: Any) -> None:
    assert a == b


def test_all_leaves_matches_jax(tree):
    leaves = jtu.tree_leaves(tree)
    assert tc.all_leaves(leaves) == jtu.all_leaves(leaves)
    assert tc.all_leaves([tree]) == jtu.all_leaves([tree])
    assert tc.all_leaves(iter([tree, 1])) == jtu.all_leaves(iter([tree, 1]))


def _is_tuple(x: Any) -> bool:
    return isinstance(x, tuple)


def test_all_leaves_with_is_leaf_matches_jax(tree):
    assert_same_outcome(
        lambda: tc.all_leaves([tree], is_leaf=_is_tuple),
        lambda: jtu.all_leaves([tree], is_leaf=_is_tuple),
        _assert_eq,
    )


@pytest.mark.parametrize("infer_inner", [False, True], ids=["explicit_inner", "inferred_inner"])
def test_tree_transpose_matches_jax(tree, infer_inner):
    jax_def = jtu.tree_structure(tree)
    tc_def = tc.tree_structure(tree)
    inner = (0, [0, None])
    n = jax_def.num_leaves
    to_transpose = jtu.tree_unflatten(
        jax_def, [(Opaque((i, 0)), [Opaque((i, 1)), None]) for i in range(n)]
    )
    tc_inner = None if infer_inner else tc.tree_structure(inner)
    jax_inner = None if infer_inner else jtu.tree_structure(inner)
    assert_same_outcome(
        lambda: tc.tree_transpose(tc_def, tc_inner, to_transpose),
        lambda: jtu.tree_transpose(jax_def, jax_inner, to_transpose),
        assert_same_tree,
    )


def test_treedef_tuple_matches_jax(tree):
    parts = [tree, [1, None], tree]
    tc_tuple = tc.treedef_tuple([tc.tree_structure(p) for p in parts])
    jax_tuple = jtu.treedef_tuple([jtu.tree_structure(p) for p in parts])
    assert isinstance(tc_tuple, tc.PyTreeDef)
    assert repr(tc_tuple) == repr(jax_tuple)
    assert tc_tuple.to_jax() == jax_tuple


# --------------------------------------------------------------------------------------------
# is_leaf
# --------------------------------------------------------------------------------------------

IS_LEAF_PREDICATES = {
    "tuples": lambda x: isinstance(x, tuple),
    "lists": lambda x: isinstance(x, list),
    "none": lambda x: x is None,
    "dicts": lambda x: isinstance(x, dict),
    "everything": lambda x: True,
    "nothing": lambda x: False,
}


@pytest.fixture(params=sorted(IS_LEAF_PREDICATES))
def is_leaf(request: pytest.FixtureRequest):
    return IS_LEAF_PREDICATES[request.param]


def test_is_leaf_flatten_matches_jax(tree, is_leaf):
    tc_leaves, tc_def = tc.tree_flatten(tree, is_leaf=is_leaf)
    jax_leaves, jax_def = jtu.tree_flatten(tree, is_leaf=is_leaf)
    assert_same_objects(tc_leaves, jax_leaves)
    assert repr(tc_def) == repr(jax_def)
    assert tc_def.to_jax() == jax_def
    assert_same_objects(tc.tree_leaves(tree, is_leaf=is_leaf), jax_leaves)
    assert tc.tree_structure(tree, is_leaf=is_leaf) == tc_def
    assert_same_tree(tc.tree_unflatten(tc_def, tc_leaves), jtu.tree_unflatten(jax_def, jax_leaves))


def test_is_leaf_tree_map_matches_jax(tree, is_leaf):
    assert_same_tree(
        tc.tree_map(Rec, tree, is_leaf=is_leaf),
        jtu.tree_map(Rec, tree, is_leaf=is_leaf),
    )
    jax_def = jtu.tree_structure(tree, is_leaf=is_leaf)
    second = jtu.tree_unflatten(jax_def, _fresh_leaves(jax_def.num_leaves))
    assert_same_tree(
        tc.tree_map(Rec, tree, second, is_leaf=is_leaf),
        jtu.tree_map(Rec, tree, second, is_leaf=is_leaf),
    )


def test_is_leaf_paths_match_jax(tree, is_leaf):
    tc_pairs, tc_def = tc.tree_flatten_with_path(tree, is_leaf=is_leaf)
    jax_pairs, jax_def = jtu.tree_flatten_with_path(tree, is_leaf=is_leaf)
    assert [p for p, _ in tc_pairs] == [p for p, _ in jax_pairs]
    assert_same_objects([x for _, x in tc_pairs], [x for _, x in jax_pairs])
    assert tc_def.to_jax() == jax_def
    assert_same_tree(
        tc.tree_map_with_path(Rec, tree, is_leaf=is_leaf),
        jtu.tree_map_with_path(Rec, tree, is_leaf=is_leaf),
    )


class _Recorder:
    """An is_leaf predicate that records every object it is called with."""

    def __init__(self, answer: Any) -> None:
        self.calls: list[Any] = []
        self.answer = answer

    def __call__(self, x: Any) -> bool:
        self.calls.append(x)
        return self.answer(x)


RECORDER_ANSWERS = {
    "never": lambda x: False,
    "lists": lambda x: isinstance(x, list),
    "namedtuple_or_dict": lambda x: hasattr(x, "_fields") or type(x) is dict,
}

IS_LEAF_ENTRY_POINTS = {
    "tree_flatten": lambda m, t, p: m.tree_flatten(t, is_leaf=p),
    "tree_leaves": lambda m, t, p: m.tree_leaves(t, is_leaf=p),
    "tree_structure": lambda m, t, p: m.tree_structure(t, is_leaf=p),
    "tree_map": lambda m, t, p: m.tree_map(lambda x: x, t, is_leaf=p),
    "tree_flatten_with_path": lambda m, t, p: m.tree_flatten_with_path(t, is_leaf=p),
    "tree_map_with_path": lambda m, t, p: m.tree_map_with_path(lambda k, x: x, t, is_leaf=p),
    "tree_reduce": lambda m, t, p: m.tree_reduce(lambda a, x: a, t, 0, is_leaf=p),
}


@pytest.mark.parametrize("answer", sorted(RECORDER_ANSWERS))
@pytest.mark.parametrize("entry", sorted(IS_LEAF_ENTRY_POINTS))
def test_is_leaf_call_sequence_matches_jax(tree, answer, entry):
    call = IS_LEAF_ENTRY_POINTS[entry]
    tc_rec = _Recorder(RECORDER_ANSWERS[answer])
    jax_rec = _Recorder(RECORDER_ANSWERS[answer])
    call(tc, tree, tc_rec)
    call(jtu, tree, jax_rec)
    assert_same_objects(tc_rec.calls, jax_rec.calls, "objects passed to is_leaf")


class _PathRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def __call__(self, path: Any, x: Any) -> bool:
        self.calls.append((path, x))
        return len(path) >= 2 and isinstance(x, (list, tuple, dict))


def test_is_leaf_takes_path_matches_jax(tree):
    tc_rec, jax_rec = _PathRecorder(), _PathRecorder()
    tc_pairs, tc_def = tc.tree_flatten_with_path(tree, is_leaf=tc_rec, is_leaf_takes_path=True)
    jax_pairs, jax_def = jtu.tree_flatten_with_path(tree, is_leaf=jax_rec, is_leaf_takes_path=True)
    assert [p for p, _ in tc_rec.calls] == [p for p, _ in jax_rec.calls]
    assert_same_objects([x for _, x in tc_rec.calls], [x for _, x in jax_rec.calls], "is_leaf")
    assert [p for p, _ in tc_pairs] == [p for p, _ in jax_pairs]
    assert_same_objects([x for _, x in tc_pairs], [x for _, x in jax_pairs])
    assert tc_def.to_jax() == jax_def


def test_is_leaf_takes_path_map_and_leaves(tree):
    def pred(path: Any, x: Any) -> bool:
        return len(path) == 1

    assert_same_tree(
        tc.tree_map_with_path(Rec, tree, is_leaf=pred, is_leaf_takes_path=True),
        jtu.tree_map_with_path(Rec, tree, is_leaf=pred, is_leaf_takes_path=True),
    )
    tc_pairs = tc.tree_leaves_with_path(tree, is_leaf=pred, is_leaf_takes_path=True)
    jax_pairs = jtu.tree_leaves_with_path(tree, is_leaf=pred, is_leaf_takes_path=True)
    assert [p for p, _ in tc_pairs] == [p for p, _ in jax_pairs]
    assert_same_objects([x for _, x in tc_pairs], [x for _, x in jax_pairs])


def test_same_leaf_helper_detects_differences():
    """Guard against a vacuous comparator: different objects must not compare as same."""
    a, b = Opaque(1), Opaque(1)
    assert not same_leaf(a, b)
    assert not same_leaf(Rec(a), Rec(b))
    assert same_leaf(Rec(a, (jtu.SequenceKey(0),)), Rec(a, (jtu.SequenceKey(0),)))
    assert not same_leaf(Rec(a, (jtu.SequenceKey(0),)), Rec(a, (jtu.SequenceKey(1),)))
    with pytest.raises(AssertionError):
        assert_same_tree({"b": 1, "a": 2}, dict(a=2, b=1))
