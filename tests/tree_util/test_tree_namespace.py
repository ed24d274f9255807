"""treeclone.tree against jax.tree, and what treeclone.tree_util added to be complete.

* the public names of treeclone.tree_util and treeclone.tree are exactly those of the installed
  jax.tree_util and jax.tree, and treeclone.tree's signatures are jax.tree's;
* every function of treeclone.tree, over the corpus (tests/support/trees.py), against jax.tree:
  the very same leaves, equal structures, the same key paths;
* tree_broadcast and tree_reduce_associative (new in tree_util, on the Rust core) through both
  namespaces; the JAX objects tree_util re-exports (Partial, KeyPath, the registry queries...)
  are JAX's own and agree with the Rust core;
* bad input: the same exception type and message as JAX.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
import pytest
import treeclone
import treeclone.tree_util as tcu
from helpers import assert_same_objects, assert_same_tree, capture, outcome, same_leaf
from treeclone import _jax_compat
from trees import Opaque, Rec

# Functions that older JAX releases lack: their tests skip there, naming the release.
needs_reduce_associative = pytest.mark.skipif(
    not hasattr(jtu, "tree_reduce_associative"),
    reason="jax.tree_util.tree_reduce_associative is new in JAX 0.7",
)
needs_registry_queries = pytest.mark.skipif(
    not hasattr(jtu, "is_tree_node"),
    reason="jax.tree_util.is_tree_node and flatten_one_level(_with_keys) are public from JAX 0.10",
)
needs_static = pytest.mark.skipif(
    not hasattr(jax.tree, "static"), reason="jax.tree.static is new in JAX 0.9"
)
# Before JAX 0.8 tree_reduce's initializer is annotated Any (no Unspecified type yet);
# treeclone's annotation is the newer "T | Unspecified".
INITIALIZER_ANNOTATED_ANY = (
    inspect.signature(jtu.tree_reduce).parameters["initializer"].annotation == "Any"
)


def _public(module: types.ModuleType) -> set[str]:
    return {name for name in dir(module) if not name.startswith("_")}


def _fresh_leaves(n: int) -> list[Opaque]:
    return [Opaque(i) for i in range(n)]


def _same_outcome(
    tc_fn: Callable[[], Any], jax_fn: Callable[[], Any], compare: Callable[[Any, Any], None]
) -> None:
    """Both return (then ``compare(tc, jax)``) or both raise: same type, same message."""
    jax_kind, jax_value = outcome(jax_fn)
    tc_kind, tc_value = outcome(tc_fn)
    if jax_kind == "err":
        assert tc_kind == "err", f"JAX raised {jax_value!r}, treeclone returned {tc_value!r}"
        assert type(tc_value) is type(jax_value), (
            f"treeclone raised {tc_value!r}, JAX {jax_value!r}"
        )
        assert str(tc_value) == str(jax_value), (
            f"message {str(tc_value)!r} != JAX's {str(jax_value)!r}"
        )
    else:
        assert tc_kind == "ok", f"treeclone raised {tc_value!r}, JAX returned {jax_value!r}"
        compare(tc_value, jax_value)


def _assert_eq(a: Any, b: Any) -> None:
    assert a == b


def _assert_same_flat(a: tuple[list[Any], Any], e: tuple[list[Any], Any]) -> None:
    assert_same_objects(a[0], e[0])
    assert isinstance(a[1], tcu.PyTreeDef)
    assert repr(a[1]) == repr(e[1])
    assert a[1].to_jax() == e[1]


def _assert_same_pairs(a: list[tuple[Any, Any]], e: list[tuple[Any, Any]]) -> None:
    assert isinstance(a, list)
    assert [p for p, _ in a] == [p for p, _ in e]
    assert all(type(p) is tuple for p, _ in a)
    assert_same_objects([x for _, x in a], [x for _, x in e])


def _assert_same_rec(a: Any, e: Any) -> None:
    assert same_leaf(a, e), f"{a!r} vs JAX's {e!r}"


# --------------------------------------------------------------------------------------------
# Names and signatures
# --------------------------------------------------------------------------------------------


def test_tree_util_public_names_are_jax_s():
    assert _public(tcu) == _public(jtu)
    assert sorted(tcu.__all__) == sorted(_public(jtu))
    assert len(set(tcu.__all__)) == len(tcu.__all__)


def test_tree_util_star_import_gives_jax_s_names():
    namespace: dict[str, Any] = {}
    exec("from treeclone.tree_util import *", namespace)
    assert set(namespace) - {"__builtins__"} == _public(jtu)


def test_tree_public_names_are_jax_s():
    assert _public(treeclone.tree) == _public(jax.tree)
    assert "tree" in treeclone.__all__
    assert treeclone.tree.__name__ == "treeclone.tree"


# JAX's own objects: types, the registry, and the queries that read one node from the registry.
REEXPORTED = (
    "DictKey",
    "FlattenedIndexKey",
    "GetAttrKey",
    "SequenceKey",
    "KeyEntry",
    "KeyPath",
    "Partial",
    "default_registry",
    "flatten_one_level",
    "flatten_one_level_with_keys",
    "is_tree_node",
    "keystr",
)


@pytest.mark.parametrize("name", [n for n in REEXPORTED if hasattr(jtu, n)])
def test_reexports_are_jax_s_objects(name):
    assert getattr(tcu, name) is getattr(jtu, name)


def test_unexported_names_stay_reachable():
    # treedef_is_strict_leaf is internal to JAX (not exported): out of dir(), still an attribute
    # (tests/support/fuzz_tree.py uses it).
    assert "treedef_is_strict_leaf" not in dir(tcu)
    assert tcu.treedef_is_strict_leaf(tcu.tree_structure(1)) is True
    assert tcu.treedef_is_strict_leaf(tcu.tree_structure(())) is False
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        tcu.no_such_name  # noqa: B018


def _normalized(signature: inspect.Signature) -> inspect.Signature:
    """JAX's "not given" sentinel defaults (one object per function) replaced by one marker."""
    return signature.replace(
        parameters=[
            p.replace(default="<unspecified>") if _jax_compat.is_unspecified(p.default) else p
            for p in signature.parameters.values()
        ]
    )


def _without_annotations(signature: inspect.Signature) -> inspect.Signature:
    return signature.replace(
        parameters=[
            p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()
        ],
        return_annotation=inspect.Signature.empty,
    )


@pytest.mark.parametrize("name", sorted(_public(jax.tree)))
def test_tree_signatures_are_jax_s(name):
    if name == "reduce" and INITIALIZER_ANNOTATED_ANY:
        pytest.skip("JAX < 0.8 annotates tree_reduce's initializer as Any")
    ours = inspect.signature(getattr(treeclone.tree, name))
    theirs = inspect.signature(getattr(jax.tree, name))
    assert _normalized(ours) == _normalized(theirs)
    assert str(ours.return_annotation) == str(theirs.return_annotation)


# The Rust core's functions carry no annotations at run time (their types are in _native.pyi).
NATIVE = {"tree_flatten", "tree_leaves", "tree_structure", "tree_map", "tree_unflatten"}


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n in tcu.__all__
        if callable(getattr(tcu, n)) and not isinstance(getattr(tcu, n), type) and n != "KeyPath"
    ),
)
def test_tree_util_signatures_are_jax_s(name):
    if name == "tree_reduce" and INITIALIZER_ANNOTATED_ANY:
        pytest.skip("JAX < 0.8 annotates tree_reduce's initializer as Any")
    ours = _normalized(inspect.signature(getattr(tcu, name)))
    theirs = _normalized(inspect.signature(getattr(jtu, name)))
    if name in NATIVE:
        ours, theirs = _without_annotations(ours), _without_annotations(theirs)
    assert ours == theirs


# --------------------------------------------------------------------------------------------
# treeclone.tree over the corpus
# --------------------------------------------------------------------------------------------

tct = treeclone.tree
jt = jax.tree


def test_flatten(tree):
    _same_outcome(lambda: tct.flatten(tree), lambda: jt.flatten(tree), _assert_same_flat)


def test_leaves(tree):
    assert_same_objects(tct.leaves(tree), jt.leaves(tree))


def test_structure(tree):
    tc_def, jax_def = tct.structure(tree), jt.structure(tree)
    assert isinstance(tc_def, tcu.PyTreeDef)
    assert repr(tc_def) == repr(jax_def)
    assert tc_def.to_jax() == jax_def
    assert tc_def == tct.flatten(tree)[1]


def test_unflatten(tree):
    jax_def = jt.structure(tree)
    new = _fresh_leaves(jax_def.num_leaves)
    expected = jt.unflatten(jax_def, new)
    assert_same_tree(tct.unflatten(tct.structure(tree), new), expected)
    assert_same_tree(tct.unflatten(tct.structure(tree), iter(new)), expected)
    # a JAX treedef is accepted too
    assert_same_tree(tct.unflatten(jax_def, new), expected)


def test_flatten_with_path(tree):
    def compare(a, e):
        _assert_same_pairs(a[0], e[0])
        assert a[1].to_jax() == e[1]

    _same_outcome(lambda: tct.flatten_with_path(tree), lambda: jt.flatten_with_path(tree), compare)


def test_leaves_with_path(tree):
    _assert_same_pairs(tct.leaves_with_path(tree), jt.leaves_with_path(tree))


def _path_pred(path: Any, x: Any) -> bool:
    return len(path) == 1 and isinstance(x, (list, tuple, dict))


def test_paths_with_is_leaf_taking_the_path(tree):
    _assert_same_pairs(
        tct.leaves_with_path(tree, _path_pred, True), jt.leaves_with_path(tree, _path_pred, True)
    )
    assert_same_tree(
        tct.map_with_path(Rec, tree, is_leaf=_path_pred, is_leaf_takes_path=True),
        jt.map_with_path(Rec, tree, is_leaf=_path_pred, is_leaf_takes_path=True),
    )


def test_map(tree):
    assert_same_tree(tct.map(Rec, tree), jt.map(Rec, tree))
    jax_def = jt.structure(tree)
    second = jt.unflatten(jax_def, _fresh_leaves(jax_def.num_leaves))
    third = jt.unflatten(jax_def, [[Opaque(i)] for i in range(jax_def.num_leaves)])
    assert_same_tree(tct.map(Rec, tree, second, third), jt.map(Rec, tree, second, third))


def _is_tuple(x: Any) -> bool:
    return isinstance(x, tuple)


def test_map_with_is_leaf(tree):
    assert_same_tree(tct.map(Rec, tree, is_leaf=_is_tuple), jt.map(Rec, tree, is_leaf=_is_tuple))


def test_map_with_path(tree):
    assert_same_tree(tct.map_with_path(Rec, tree), jt.map_with_path(Rec, tree))
    jax_def = jt.structure(tree)
    second = jt.unflatten(jax_def, _fresh_leaves(jax_def.num_leaves))
    assert_same_tree(tct.map_with_path(Rec, tree, second), jt.map_with_path(Rec, tree, second))


def _recording_reducer(calls: list[Any]) -> Callable[[Any, Any], Any]:
    def keep_last(a: Any, b: Any) -> Any:
        calls.append(a)
        calls.append(b)
        return b

    return keep_last


def test_reduce(tree):
    tc_calls: list[Any] = []
    jax_calls: list[Any] = []
    start = Opaque("start")
    _same_outcome(
        lambda: tct.reduce(_recording_reducer(tc_calls), tree, start),
        lambda: jt.reduce(_recording_reducer(jax_calls), tree, start),
        lambda a, e: assert_same_objects([a], [e], "result"),
    )
    assert_same_objects(tc_calls, jax_calls, "reducer arguments")
    # without an initializer (an empty tree: the same TypeError as functools.reduce)
    tc_calls.clear()
    jax_calls.clear()
    _same_outcome(
        lambda: tct.reduce(_recording_reducer(tc_calls), tree),
        lambda: jt.reduce(_recording_reducer(jax_calls), tree),
        lambda a, e: assert_same_objects([a], [e], "result"),
    )
    assert_same_objects(tc_calls, jax_calls, "reducer arguments")


def test_all(tree):
    all_true = jt.map(lambda _: True, tree)
    assert tct.all(all_true) is jt.all(all_true) is True
    leaves, jax_def = jt.flatten(tree)
    if leaves:
        one_false = jt.unflatten(jax_def, [True] * (len(leaves) - 1) + [0])
        assert tct.all(one_false) is jt.all(one_false) is False
    # arrays among the leaves: the same "truth value is ambiguous" error
    _same_outcome(lambda: tct.all(tree), lambda: jt.all(tree), _assert_eq)
    _same_outcome(
        lambda: tct.all(tree, is_leaf=_is_tuple),
        lambda: jt.all(tree, is_leaf=_is_tuple),
        _assert_eq,
    )


@pytest.mark.parametrize("infer_inner", [False, True], ids=["explicit_inner", "inferred_inner"])
def test_transpose(tree, infer_inner):
    jax_def = jt.structure(tree)
    n = jax_def.num_leaves
    to_transpose = jt.unflatten(
        jax_def, [(Opaque((i, 0)), [Opaque((i, 1)), None]) for i in range(n)]
    )
    inner = (0, [0, None])
    _same_outcome(
        lambda: tct.transpose(
            tct.structure(tree), None if infer_inner else tct.structure(inner), to_transpose
        ),
        lambda: jt.transpose(jax_def, None if infer_inner else jt.structure(inner), to_transpose),
        assert_same_tree,
    )


# --------------------------------------------------------------------------------------------
# broadcast and reduce_associative, through treeclone.tree and treeclone.tree_util
# --------------------------------------------------------------------------------------------


class Api:
    """One of the two namespaces, with ``jax.tree``'s names (tree_util's have ``tree_``)."""

    def __init__(self, tc: types.ModuleType, jax_module: types.ModuleType, prefix: str) -> None:
        self.tc, self.jax, self.prefix = tc, jax_module, prefix

    def pair(self, name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return getattr(self.tc, self.prefix + name), getattr(self.jax, self.prefix + name)


APIS = {"tree": Api(treeclone.tree, jax.tree, ""), "tree_util": Api(tcu, jtu, "tree_")}


@pytest.fixture(params=sorted(APIS))
def api(request: pytest.FixtureRequest) -> Api:
    return APIS[request.param]


def test_broadcast_onto_deeper_tree(tree, api):
    tc_broadcast, jax_broadcast = api.pair("broadcast")
    jax_def = jt.structure(tree)
    full = jt.unflatten(
        jax_def, [[Opaque(i), {"x": (i, None), "y": ()}] for i in range(jax_def.num_leaves)]
    )
    _same_outcome(
        lambda: tc_broadcast(tree, full), lambda: jax_broadcast(tree, full), assert_same_tree
    )


def test_broadcast_onto_itself(tree, api):
    tc_broadcast, jax_broadcast = api.pair("broadcast")
    _same_outcome(
        lambda: tc_broadcast(tree, tree), lambda: jax_broadcast(tree, tree), assert_same_tree
    )


def test_broadcast_of_a_leaf(tree, api):
    tc_broadcast, jax_broadcast = api.pair("broadcast")
    leaf = Opaque("everywhere")
    _same_outcome(
        lambda: tc_broadcast(leaf, tree), lambda: jax_broadcast(leaf, tree), assert_same_tree
    )


def test_broadcast_with_is_leaf(tree, api):
    tc_broadcast, jax_broadcast = api.pair("broadcast")
    jax_def = jt.structure(tree, is_leaf=_is_tuple)
    full = jt.unflatten(jax_def, [[Opaque(i)] for i in range(jax_def.num_leaves)])
    _same_outcome(
        lambda: tc_broadcast(tree, full, is_leaf=_is_tuple),
        lambda: jax_broadcast(tree, full, is_leaf=_is_tuple),
        assert_same_tree,
    )
    _same_outcome(
        lambda: tc_broadcast(tree, tree, _is_tuple),
        lambda: jax_broadcast(tree, tree, _is_tuple),
        assert_same_tree,
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda t: ([t], (t,)),
        lambda t: ([t, t], [t]),
        lambda t: ({"a": t}, {"b": t}),
        lambda t: ((t, 1), (t, Opaque("x"), 2)),
    ],
    ids=["list_vs_tuple", "lengths", "dict_keys", "lengths_below"],
)
def test_broadcast_not_a_prefix(tree, api, make):
    tc_broadcast, jax_broadcast = api.pair("broadcast")
    prefix, full = make(tree)
    _same_outcome(
        lambda: tc_broadcast(prefix, full), lambda: jax_broadcast(prefix, full), _assert_eq
    )


def test_broadcast_prefix_mismatch_inside(tree, api):
    # the corpus tree matches; the mismatch is next to it, below the root
    tc_broadcast, jax_broadcast = api.pair("broadcast")
    prefix = {"t": tree, "l": [1, [2, 3]]}
    full = {"t": tree, "l": [1, [2]]}
    _same_outcome(
        lambda: tc_broadcast(prefix, full), lambda: jax_broadcast(prefix, full), _assert_eq
    )


@needs_reduce_associative
def test_reduce_associative(tree, api):
    tc_reduce, jax_reduce = api.pair("reduce_associative")
    # Rec(a, b) records the call tree: the same balanced tree of calls on the same leaves
    _same_outcome(lambda: tc_reduce(Rec, tree), lambda: jax_reduce(Rec, tree), _assert_same_rec)
    identity = Opaque("identity")
    _same_outcome(
        lambda: tc_reduce(Rec, tree, identity=identity),
        lambda: jax_reduce(Rec, tree, identity=identity),
        _assert_same_rec,
    )
    _same_outcome(
        lambda: tc_reduce(Rec, tree, is_leaf=_is_tuple, identity=identity),
        lambda: jax_reduce(Rec, tree, is_leaf=_is_tuple, identity=identity),
        _assert_same_rec,
    )


@needs_reduce_associative
def test_reduce_associative_call_order(api):
    tc_reduce, jax_reduce = api.pair("reduce_associative")
    tc_calls: list[Any] = []
    jax_calls: list[Any] = []
    tree = [Opaque(i) for i in range(11)]
    tc_reduce(_recording_reducer(tc_calls), tree)
    jax_reduce(_recording_reducer(jax_calls), tree)
    assert_same_objects(tc_calls, jax_calls, "operation arguments")


def _jax_sentinel(function: Callable[..., Any], parameter: str) -> Any:
    return inspect.signature(function).parameters[parameter].default


@pytest.mark.parametrize("which", ["tree_reduce", "tree_reduce_associative"])
def test_jax_s_own_sentinel_means_not_given(which):
    if not hasattr(jtu, which):
        pytest.skip(f"jax.tree_util.{which} is new in JAX 0.7")
    # Passing JAX's "not given" default explicitly is the same as not passing it, in both.
    parameter = "initializer" if which == "tree_reduce" else "identity"
    sentinel = _jax_sentinel(getattr(jtu, which), parameter)
    for tree in ([1, 2, 3], []):
        _same_outcome(
            lambda t=tree: getattr(tcu, which)(operator.add, t, **{parameter: sentinel}),
            lambda t=tree: getattr(jtu, which)(operator.add, t, **{parameter: sentinel}),
            _assert_eq,
        )


# --------------------------------------------------------------------------------------------
# static
# --------------------------------------------------------------------------------------------

FIELD_ATTRIBUTES = ("default", "default_factory", "init", "repr", "hash", "compare", "kw_only")


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"default": 1}, {"default_factory": list, "repr": False}, {"metadata": {"a": 1}}],
    ids=["none", "default", "factory", "metadata"],
)
@needs_static
def test_static_is_jax_s_field(kwargs):
    ours, theirs = tct.static(**kwargs), jt.static(**kwargs)
    assert type(ours) is type(theirs) is dataclasses.Field
    for attribute in FIELD_ATTRIBUTES:
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert dict(ours.metadata) == dict(theirs.metadata)


@needs_static
def test_static_bad_arguments():
    _same_outcome(lambda: tct.static(1), lambda: jt.static(1), _assert_eq)
    _same_outcome(lambda: tct.static(nope=1), lambda: jt.static(nope=1), _assert_eq)


@needs_static
def test_static_field_is_aux_data():
    @tcu.register_dataclass
    @dataclasses.dataclass
    class Layer:
        w: Any
        name: str = tct.static(default="dense")

    layer = Layer(Opaque("w"), "head")
    _same_outcome(lambda: tct.flatten(layer), lambda: jt.flatten(layer), _assert_same_flat)


# --------------------------------------------------------------------------------------------
# JAX's re-exported objects agree with the Rust core
# --------------------------------------------------------------------------------------------


def test_partial_is_a_node_to_both():
    p = tcu.Partial(Rec, Opaque("a"), k=[Opaque("b"), None])
    _same_outcome(lambda: tcu.tree_flatten(p), lambda: jtu.tree_flatten(p), _assert_same_flat)
    new = _fresh_leaves(2)
    rebuilt = tcu.tree_unflatten(tcu.tree_structure(p), new)
    assert type(rebuilt) is tcu.Partial
    assert rebuilt.args[0] is new[0] and rebuilt.keywords["k"][0] is new[1]
    _assert_same_pairs(tcu.tree_leaves_with_path(p), jtu.tree_leaves_with_path(p))


@needs_registry_queries
def test_is_tree_node_agrees_with_the_rust_core(tree):
    # a node type (with or without children) never flattens to a single leaf, and vice versa
    is_node = tcu.is_tree_node(type(tree))
    assert is_node is jtu.is_tree_node(type(tree))
    assert is_node is not tcu.treedef_is_strict_leaf(tcu.tree_structure(tree))


@needs_registry_queries
def test_flatten_one_level_agrees_with_the_rust_core(tree):
    if not tcu.is_tree_node(type(tree)):
        return
    children, _ = tcu.flatten_one_level(tree)
    keyed, _ = tcu.flatten_one_level_with_keys(tree)
    children = list(children)
    assert len(children) == len(list(keyed))
    assert [tcu.tree_structure(c) for c in children] == tcu.tree_structure(tree).children()


# --------------------------------------------------------------------------------------------
# Bad input: the same exception type and message
# --------------------------------------------------------------------------------------------


class FailingNode:
    """A node type whose flatten function raises ValueError."""


def _fail(node: FailingNode) -> Any:
    raise ValueError("FailingNode cannot be flattened")


tcu.register_pytree_node(FailingNode, _fail, lambda aux, children: FailingNode())


def _raise(x: Any) -> bool:
    raise ZeroDivisionError("is_leaf says no")


# Each case gets ``get(name)``: the function of that jax.tree name in the namespace under test.
ERROR_CASES: dict[str, Callable[[Callable[[str], Any]], Any]] = {
    "map_keys": lambda get: get("map")(operator.add, {"a": 1}, {"b": 1}),
    "map_lengths": lambda get: get("map")(operator.add, [1, 2], [1]),
    "map_types": lambda get: get("map")(operator.add, [1, 2], (1, 2)),
    "map_node_vs_leaf": lambda get: get("map")(operator.add, [[1]], [1]),
    "map_f_raises": lambda get: get("map")(lambda x: 1 / 0, [1]),
    "map_is_leaf_raises": lambda get: get("map")(Rec, [1], is_leaf=_raise),
    "map_with_path_lengths": lambda get: get("map_with_path")(Rec, [1, 2], [1]),
    "map_with_path_keys": lambda get: get("map_with_path")(Rec, {"a": 1}, {"b": 1}),
    "flatten_is_leaf_raises": lambda get: get("flatten")([1], is_leaf=_raise),
    "flatten_failing_node": lambda get: get("flatten")([FailingNode()]),
    "leaves_failing_node": lambda get: get("leaves")({"a": FailingNode()}),
    "structure_is_leaf_raises": lambda get: get("structure")((1,), is_leaf=_raise),
    "flatten_with_path_is_leaf_raises": lambda get: get("flatten_with_path")([1], _raise),
    "leaves_with_path_failing_node": lambda get: get("leaves_with_path")([FailingNode()]),
    "unflatten_not_a_treedef": lambda get: get("unflatten")([1], [1]),
    "unflatten_none": lambda get: get("unflatten")(None, []),
    "reduce_empty": lambda get: get("reduce")(operator.add, [None, {}]),
    "reduce_function_raises": lambda get: get("reduce")(operator.add, [1, "a"]),
    "reduce_associative_empty": lambda get: get("reduce_associative")(operator.add, []),
    "reduce_associative_raises": lambda get: get("reduce_associative")(operator.add, [1, "a"]),
    "all_arrays": lambda get: get("all")([jax.numpy.ones(3)]),
    "transpose_mismatch": lambda get: get("transpose")(
        get("structure")([0, 0]), get("structure")((0, 0)), [(1, 2), (3,)]
    ),
    "transpose_inferred_mismatch": lambda get: get("transpose")(
        get("structure")([0, 0]), None, ((1, 2), (3, 4))
    ),
    "transpose_not_a_treedef": lambda get: get("transpose")([0, 0], None, [(1, 2), (3, 4)]),
    "broadcast_types": lambda get: get("broadcast")([1, 2], (1, 2)),
    "broadcast_lengths": lambda get: get("broadcast")([1, (2, 3)], [1, (2,)]),
    "broadcast_keys": lambda get: get("broadcast")({"a": 1}, {"b": 1}),
    "broadcast_node_vs_leaf": lambda get: get("broadcast")([[1, 2]], [1]),
    "broadcast_none_vs_leaf": lambda get: get("broadcast")([None], [1]),
    "broadcast_is_leaf_raises": lambda get: get("broadcast")([1], [1], _raise),
    # the prefix is fine, flattening the full tree's subtree fails with a ValueError: JAX finds
    # no prefix error to report and fails unpacking the empty list of errors
    "broadcast_failing_node_below_a_leaf": lambda get: get("broadcast")(1, [FailingNode()]),
    "broadcast_failing_node": lambda get: get("broadcast")([1], [FailingNode()]),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_bad_input_same_error(api, case):
    tc_get = lambda name: api.pair(name)[0]  # noqa: E731
    jax_get = lambda name: api.pair(name)[1]  # noqa: E731
    jax_exc = capture(lambda: ERROR_CASES[case](jax_get))
    assert jax_exc is not None, "the case must make JAX raise"
    _same_outcome(lambda: ERROR_CASES[case](tc_get), lambda: ERROR_CASES[case](jax_get), _assert_eq)


def _cyclic() -> list[Any]:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    return cyclic


@pytest.mark.parametrize(
    "make",
    [lambda c: (1, c), lambda c: ([1, 2], c), lambda c: (c, [1, 2])],
    ids=["leaf_prefix", "list_prefix", "cyclic_prefix"],
)
def test_broadcast_cyclic_tree_is_a_cycle_error(api, make):
    # Not JAX's answer: JAX recurses until it fails (a SystemError). treeclone reports the cycle,
    # as its flatten does (docs/semantics.md).
    tc_broadcast, _ = api.pair("broadcast")
    prefix, full = make(_cyclic())
    with pytest.raises(ValueError, match="^cycle detected in pytree"):
        tc_broadcast(prefix, full)


def test_is_leaf_not_callable_same_error_type():
    # JAX's message is its binding's dump of the accepted argument types; the type is the same.
    for name in ("flatten", "leaves", "structure"):
        tc_exc = capture(lambda n=name: getattr(tct, n)([1], is_leaf=5))
        jax_exc = capture(lambda n=name: getattr(jt, n)([1], is_leaf=5))
        assert type(tc_exc) is type(jax_exc) is TypeError, name


def test_unflatten_not_iterable_same_error_type():
    # As above: JAX's message is a binding's dump ("incompatible function arguments").
    tc_exc = capture(lambda: tct.unflatten(tct.structure([1, 2]), 5))
    jax_exc = capture(lambda: jt.unflatten(jt.structure([1, 2]), 5))
    assert type(tc_exc) is type(jax_exc) is TypeError


@pytest.mark.parametrize("leaves", [[1], [1, 2, 3]], ids=["too_few", "too_many"])
def test_unflatten_leaf_count_error_type(leaves):
    tc_exc = capture(lambda: tct.unflatten(tct.structure([0, 0]), leaves))
    jax_exc = capture(lambda: jt.unflatten(jt.structure([0, 0]), leaves))
    assert type(tc_exc) is type(jax_exc) is ValueError


@pytest.mark.parametrize("leaves", [[1], [1, 2, 3]], ids=["too_few", "too_many"])
def test_unflatten_leaf_count_error_message(leaves):
    tc_exc = capture(lambda: tct.unflatten(tct.structure([0, 0]), leaves))
    jax_exc = capture(lambda: jt.unflatten(jt.structure([0, 0]), leaves))
    assert str(tc_exc) == str(jax_exc)
