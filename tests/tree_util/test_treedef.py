"""tc.PyTreeDef: equality, hashing, pickling, conversions and structural operations."""

from __future__ import annotations

import collections
import copy
import functools
import pickle
from typing import Any

import jax.tree_util as jtu
import pytest
import treeclone
import treeclone.tree_util as tc
from helpers import (
    assert_same_objects,
    assert_same_outcome,
    assert_same_tree,
    check_same_error,
    run_script,
)
from trees import BIG_IDS, CORPUS_BY_ID, CORPUS_IDS, Opaque, PairJ, PairT, Point, StaticT

SMALL_IDS = [i for i in CORPUS_IDS if i not in BIG_IDS]


@functools.cache
def _defs(corpus_id: str) -> tuple[Any, Any]:
    """(treeclone treedef, jax treedef) of one fixed instance of a corpus tree."""
    tree = CORPUS_BY_ID[corpus_id]()
    return tc.tree_structure(tree), jtu.tree_structure(tree)


def test_pytreedef_is_exported():
    assert treeclone.PyTreeDef is tc.PyTreeDef
    assert isinstance(tc.tree_structure([1]), treeclone.PyTreeDef)


@pytest.mark.parametrize(
    "name", ["SequenceKey", "DictKey", "GetAttrKey", "FlattenedIndexKey"], ids=str
)
def test_key_entry_classes_are_jax_classes(name):
    assert getattr(tc, name) is getattr(jtu, name)


# --------------------------------------------------------------------------------------------
# equality and hashing
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a_id", SMALL_IDS)
def test_pairwise_equality_agrees_with_jax(a_id):
    tc_a, jax_a = _defs(a_id)
    mismatches = []
    for b_id in SMALL_IDS:
        tc_b, jax_b = _defs(b_id)
        expected = jax_a == jax_b
        got = tc_a == tc_b
        if got != expected:
            mismatches.append(f"{a_id} == {b_id}: treeclone {got}, JAX {expected}")
        if (tc_a != tc_b) != (not expected):
            mismatches.append(f"{a_id} != {b_id}: treeclone {tc_a != tc_b}, JAX {not expected}")
        if expected and hash(tc_a) != hash(tc_b):
            mismatches.append(f"{a_id}, {b_id}: equal but hashes differ")
    assert not mismatches, "\n".join(mismatches)


def test_fresh_flatten_gives_equal_treedef(corpus_id):
    first = tc.tree_structure(CORPUS_BY_ID[corpus_id]())
    second = tc.tree_structure(CORPUS_BY_ID[corpus_id]())
    assert first == second
    assert not (first != second)
    assert hash(first) == hash(second)


def test_treedefs_as_dict_keys():
    table: dict[Any, str] = {}
    for corpus_id in SMALL_IDS:
        table.setdefault(_defs(corpus_id)[0], corpus_id)
    for corpus_id in SMALL_IDS:
        fresh = tc.tree_structure(CORPUS_BY_ID[corpus_id]())
        assert fresh in table, f"{corpus_id}: freshly built treedef not found as a dict key"
        found = table[fresh]
        assert _defs(found)[1] == _defs(corpus_id)[1], f"{corpus_id} maps to {found}"
    # As many distinct keys as JAX has distinct treedefs.
    jax_distinct: list[Any] = []
    for corpus_id in SMALL_IDS:
        jd = _defs(corpus_id)[1]
        if not any(jd == other for other in jax_distinct):
            jax_distinct.append(jd)
    assert len(table) == len(jax_distinct)
    assert len({_defs(i)[0] for i in SMALL_IDS}) == len(jax_distinct)


@pytest.mark.parametrize(
    "other", [1, None, "PyTreeDef(*)", object()], ids=["int", "None", "str", "object"]
)
def test_equality_with_non_treedef_is_false(other):
    assert (tc.tree_structure([1, 2]) == other) is False


@pytest.mark.parametrize(
    "a, b",
    [
        ([1, 2], (1, 2)),
        ([1, 2], [1, [2]]),
        ({"a": 1}, {"b": 1}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (None, 1),
        (None, ()),
        (Point(1, 2), (1, 2)),
        (PairJ(1, 2, meta="x"), PairJ(1, 2, meta="y")),
        (PairJ(1, 2), PairT(1, 2)),
        (StaticT(1), StaticT(2)),
        (StaticT(1), StaticT(1)),
        ({1: 1}, {1.0: 1}),
    ],
    ids=lambda v: type(v).__name__,
)
def test_equality_examples_agree_with_jax(a, b):
    assert (tc.tree_structure(a) == tc.tree_structure(b)) == (
        jtu.tree_structure(a) == jtu.tree_structure(b)
    )


def test_treedef_from_jax_and_from_flatten_hash_equal(corpus_id):
    tc_def, jax_def = _defs(corpus_id)
    assert hash(tc.PyTreeDef.from_jax(jax_def)) == hash(tc_def)


def test_to_jax_from_jax_roundtrip(corpus_id):
    tc_def, jax_def = _defs(corpus_id)
    assert tc.PyTreeDef.from_jax(tc_def.to_jax()) == tc_def
    assert tc.PyTreeDef.from_jax(jax_def).to_jax() == jax_def


# --------------------------------------------------------------------------------------------
# pickling / copying
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_roundtrip(corpus_id, protocol):
    tc_def, jax_def = _defs(corpus_id)
    restored = pickle.loads(pickle.dumps(tc_def, protocol=protocol))
    assert isinstance(restored, tc.PyTreeDef)
    assert restored == tc_def
    assert hash(restored) == hash(tc_def)
    assert repr(restored) == repr(jax_def)
    assert restored.to_jax() == jax_def


def test_unpickled_treedef_unflattens_like_jax(corpus_id):
    tc_def, jax_def = _defs(corpus_id)
    restored = pickle.loads(pickle.dumps(tc_def))
    leaves = [Opaque(i) for i in range(jax_def.num_leaves)]
    assert_same_tree(restored.unflatten(leaves), jax_def.unflatten(leaves))


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copy(copier):
    tree = {"a": [1, PairT(2, None)], "b": Point(StaticT(3), ())}
    td = tc.tree_structure(tree)
    dup = copier(td)
    assert dup == td
    assert repr(dup) == repr(jtu.tree_structure(tree))


def test_pickle_loads_in_fresh_process():
    tree = {"a": [1, PairT(2, None)], "b": Point(StaticT(3), ()), "c": PairJ(None, [4])}
    payload = pickle.dumps(tc.tree_structure(tree))
    expected = repr(jtu.tree_structure(tree))
    out = run_script(
        f"""
        import pickle
        import trees
        td = pickle.loads({payload!r})
        assert isinstance(td, tc.PyTreeDef), type(td)
        print("REPR=" + repr(td))
        rebuilt = td.unflatten([10, 20, 30])
        assert jtu.tree_leaves(rebuilt) == [10, 20, 30]
        assert td.to_jax() == jtu.tree_structure(rebuilt)
        """
    )
    assert f"REPR={expected}" in out


# --------------------------------------------------------------------------------------------
# structural operations
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "treedef_tree, tree",
    [
        ([1, [2, 3]], [1, (2, 3)]),
        ([1, [2, 3]], [1, [2, 3, 4]]),
        ({"a": 1, "b": 2}, {"a": 1, "c": 2}),
        ({"a": 1, "b": 2}, {"a": 1}),
        (PairJ(1, 2, meta="x"), PairJ(1, 2, meta="y")),
        (PairJ(1, 2), PairT(1, 2)),
        (Point(1, 2), (1, 2)),
        ((1, None), (1, 2)),
        ((1, 2), (1, None)),
        ([1], 1),
        (StaticT(1), StaticT(2)),
        ({"a": 1}, {"a": [1, 2]}),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_flatten_up_to_mismatch_matches_jax(treedef_tree, tree):
    assert_same_outcome(
        lambda: tc.tree_structure(treedef_tree).flatten_up_to(tree),
        lambda: jtu.tree_structure(treedef_tree).flatten_up_to(tree),
        assert_same_objects,
    )


class _FieldsTuple(tuple):
    """A tuple subclass with ``_fields`` that is not a namedtuple type."""

    _fields = ("x", "y")


_OtherPoint = collections.namedtuple("_OtherPoint", "x y")
_WidePoint = collections.namedtuple("Point", "x y z")  # Point's name, another type


@pytest.mark.parametrize(
    "tree",
    [(1, 2), [1, 2], None, 1, _OtherPoint(1, 2), _WidePoint(1, 2, 3), _FieldsTuple((1, 2))],
    ids=["tuple", "list", "none", "int", "other_namedtuple", "wider_namedtuple", "fields_tuple"],
)
def test_flatten_up_to_namedtuple_errors_are_jaxlibs(tree):
    """jaxlib's texts and order of checks for a named tuple node: not a tuple with _fields
    ("Expected named tuple, got ..."), then the arity, then the type."""
    check_same_error(
        lambda: tc.tree_structure(Point(1, 2)).flatten_up_to(tree),
        lambda: jtu.tree_structure(Point(1, 2)).flatten_up_to(tree),
        repr(tree),
    )


def test_tree_map_rest_mismatch_matches_jax():
    cases = [([1, 2], [1, 2, 3]), ({"a": 1}, {"b": 1}), ((1, 2), [1, 2]), (None, 1)]
    for first, second in cases:
        assert_same_outcome(
            lambda first=first, second=second: tc.tree_map(lambda a, b: a, first, second),
            lambda first=first, second=second: jtu.tree_map(lambda a, b: a, first, second),
            assert_same_tree,
        )


@pytest.mark.parametrize(
    "outer, inner",
    [
        ([1, 2], (1, 2)),
        ({"a": 1}, None),
        ((1, (2, 3)), {"x": [1]}),
        (PairT(1, 2), Point(1, 2)),
        (1, [1, 2]),
        ([], [1]),
        (None, [1]),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_compose_examples(outer, inner):
    got = tc.tree_structure(outer).compose(tc.tree_structure(inner))
    expected = jtu.tree_structure(outer).compose(jtu.tree_structure(inner))
    assert repr(got) == repr(expected)
    assert got.to_jax() == expected
    composed_tree = jtu.tree_unflatten(expected, [Opaque(i) for i in range(expected.num_leaves)])
    assert got == tc.tree_structure(composed_tree)


def test_treedef_tuple_of_leaves_and_nodes():
    defs = [tc.tree_structure(x) for x in (1, None, [1, 2], {"a": PairT(1, 2)})]
    jax_defs = [jtu.tree_structure(x) for x in (1, None, [1, 2], {"a": PairT(1, 2)})]
    got = tc.treedef_tuple(defs)
    assert got.to_jax() == jtu.treedef_tuple(jax_defs)
    assert tc.treedef_tuple([]).to_jax() == jtu.treedef_tuple([])


def test_children_unflatten_consistency(corpus_id):
    tc_def, jax_def = _defs(corpus_id)
    children = tc_def.children()
    if jax_def.node_data() is None:  # a leaf
        assert children == []
        assert (tc_def.num_leaves, tc_def.num_nodes) == (1, 1)
        return
    assert sum(c.num_leaves for c in children) == tc_def.num_leaves
    assert sum(c.num_nodes for c in children) == tc_def.num_nodes - 1


def test_unflatten_too_few_and_too_many_raise_value_error():
    # jaxlib's exact text: the count given is named only when it is too small.
    td, jax_td = tc.tree_structure([1, (2, 3)]), jtu.tree_structure([1, (2, 3)])
    for leaves in ([1, 2], [1, 2, 3, 4]):
        with pytest.raises(ValueError) as ours:
            tc.tree_unflatten(td, leaves)
        with pytest.raises(ValueError) as theirs:
            jax_td.unflatten(leaves)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="expected 3, got 2"):
        td.unflatten([1, 2])


def test_unflatten_non_iterable_raises_type_error_like_jax():
    with pytest.raises(TypeError):
        jtu.tree_structure([1]).unflatten(5)
    with pytest.raises(TypeError):
        tc.tree_structure([1]).unflatten(5)


def test_num_properties_are_ints(corpus_id):
    tc_def, _ = _defs(corpus_id)
    assert type(tc_def.num_leaves) is int
    assert type(tc_def.num_nodes) is int
