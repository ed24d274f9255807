"""Module-level pytree node types and the shared corpus of trees.

Everything here lives at module level so that treedefs mentioning these types pickle.

Registration layout (deliberate):

* ``*J`` types are registered ONLY through ``jax.tree_util``; most of them before
  ``treeclone`` is imported (see ``TREECLONE_IMPORTED_BEFORE_JAX_REGISTRATIONS``) and the
  ``Late*`` ones after it.
* ``*T`` types are registered ONLY through ``treeclone.tree_util``.

Every one of the six registration functions is used through both modules.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import sys
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

# True when something imported treeclone before this module (then the "registered with JAX
# before treeclone was imported" scenario is not exercised in-process; test_registration has a
# subprocess test for it as well).
TREECLONE_IMPORTED_BEFORE_JAX_REGISTRATIONS = "treeclone" in sys.modules


# --------------------------------------------------------------------------------------------
# namedtuples and builtin subclasses (no registration needed)
# --------------------------------------------------------------------------------------------

Point = collections.namedtuple("Point", ["x", "y"])
Empty = collections.namedtuple("Empty", [])
Outer = collections.namedtuple("Outer", ["inner", "tag", "rest"])


class PointSub(Point):
    """A subclass of a namedtuple (JAX still treats it as a namedtuple node)."""


class DictSub(dict):
    """Plain dict subclass: a leaf for JAX."""


class ListSub(list):
    """Plain list subclass: a leaf for JAX."""


class TupleSub(tuple):
    """Plain tuple subclass (no _fields): a leaf for JAX."""

    __slots__ = ()


class OrderedDictSub(collections.OrderedDict):
    """OrderedDict subclass: a leaf for JAX."""


class DefaultDictSub(collections.defaultdict):
    """defaultdict subclass: a leaf for JAX."""


class Opaque:
    """An unregistered object used as a leaf."""

    def __init__(self, tag: Any = None) -> None:
        self.tag = tag

    def __repr__(self) -> str:
        return f"Opaque({self.tag!r})"


# --------------------------------------------------------------------------------------------
# Custom node implementations (unregistered bases; registered subclasses below)
# --------------------------------------------------------------------------------------------


class _Pair:
    """Two children and a string of aux data."""

    def __init__(self, a: Any, b: Any, meta: str = "pair") -> None:
        self.a = a
        self.b = b
        self.meta = meta

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.a!r}, {self.b!r}, meta={self.meta!r})"


def _pair_flatten(p: _Pair) -> tuple[tuple[Any, Any], str]:
    return (p.a, p.b), p.meta


def _pair_flatten_with_keys(p: _Pair) -> tuple[tuple[tuple[Any, Any], ...], str]:
    return ((jtu.GetAttrKey("a"), p.a), (jtu.DictKey("b"), p.b)), p.meta


def _pair_unflatten(cls: type) -> Callable[[str, Any], _Pair]:
    def unflatten(meta: str, children: Any) -> _Pair:
        a, b = children
        return cls(a, b, meta=meta)

    return unflatten


class _Bag:
    """A variable number of children; aux is ``(name, count)``. Used with the *_class APIs."""

    def __init__(self, items: Any, name: str = "bag") -> None:
        self.items = list(items)
        self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.items!r}, name={self.name!r})"

    def tree_flatten(self) -> tuple[list[Any], tuple[str, int]]:
        return list(self.items), (self.name, len(self.items))

    def tree_flatten_with_keys(self) -> tuple[list[tuple[Any, Any]], tuple[str, int]]:
        return [(jtu.SequenceKey(i), x) for i, x in enumerate(self.items)], (
            self.name,
            len(self.items),
        )

    @classmethod
    def tree_unflatten(cls, aux: tuple[str, int], children: Any) -> _Bag:
        return cls(list(children), name=aux[0])


class _StaticVal:
    """Hashable value object, registered with register_static (a node with no children)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.value == self.value  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.value))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"


# --------------------------------------------------------------------------------------------
# Registered ONLY through jax.tree_util, before treeclone is imported
# --------------------------------------------------------------------------------------------


class PairJ(_Pair):
    """register_pytree_node via jax (no key function: FlattenedIndexKey paths)."""


jtu.register_pytree_node(PairJ, _pair_flatten, _pair_unflatten(PairJ))


class KeyedJ(_Pair):
    """register_pytree_with_keys via jax (GetAttrKey / DictKey paths)."""


jtu.register_pytree_with_keys(KeyedJ, _pair_flatten_with_keys, _pair_unflatten(KeyedJ))


@jtu.register_pytree_node_class
class BagJ(_Bag):
    """register_pytree_node_class via jax."""


@jtu.register_pytree_with_keys_class
class KeyBagJ(_Bag):
    """register_pytree_with_keys_class via jax."""


@dataclasses.dataclass
class DataJ:
    """register_dataclass via jax with explicit data/meta fields."""

    w: Any
    b: Any
    name: str = "layer"
    size: int = 0


jtu.register_dataclass(DataJ, data_fields=["w", "b"], meta_fields=["name", "size"])


@jtu.register_static
class StaticJ(_StaticVal):
    """register_static via jax."""


class RegisteredDictJ(dict):
    """A dict subclass that IS registered (as a custom node) via jax."""


jtu.register_pytree_node(
    RegisteredDictJ,
    lambda d: (tuple(d[k] for k in sorted(d)), tuple(sorted(d))),
    lambda keys, children: RegisteredDictJ(zip(keys, children, strict=True)),
)


# --------------------------------------------------------------------------------------------
# Registered ONLY through treeclone.tree_util
# --------------------------------------------------------------------------------------------

import treeclone.tree_util as tc  # noqa: E402


class PairT(_Pair):
    """register_pytree_node via treeclone."""


tc.register_pytree_node(PairT, _pair_flatten, _pair_unflatten(PairT))


class PairWithKeysT(_Pair):
    """register_pytree_node via treeclone, with the optional flatten_with_keys_func."""


tc.register_pytree_node(
    PairWithKeysT,
    _pair_flatten,
    _pair_unflatten(PairWithKeysT),
    _pair_flatten_with_keys,
)


class KeyedT(_Pair):
    """register_pytree_with_keys via treeclone, also passing the optional flatten_func."""


tc.register_pytree_with_keys(
    KeyedT, _pair_flatten_with_keys, _pair_unflatten(KeyedT), flatten_func=_pair_flatten
)


@tc.register_pytree_node_class
class BagT(_Bag):
    """register_pytree_node_class via treeclone."""


@tc.register_pytree_with_keys_class
class KeyBagT(_Bag):
    """register_pytree_with_keys_class via treeclone."""


@tc.register_dataclass
@dataclasses.dataclass
class DataT:
    """register_dataclass via treeclone, fields inferred from ``static`` metadata."""

    w: Any
    b: Any
    activation: str = dataclasses.field(default="relu", metadata={"static": True})


@tc.register_static
class StaticT(_StaticVal):
    """register_static via treeclone."""


# --------------------------------------------------------------------------------------------
# Registered ONLY through jax.tree_util AFTER treeclone was imported
# --------------------------------------------------------------------------------------------


class LatePairJ(_Pair):
    """register_pytree_node via jax after ``import treeclone``."""


jtu.register_pytree_node(LatePairJ, _pair_flatten, _pair_unflatten(LatePairJ))


@jtu.register_dataclass
@dataclasses.dataclass
class LateDataJ:
    """register_dataclass via jax after ``import treeclone``."""

    x: Any
    y: Any
    mode: str = dataclasses.field(default="train", metadata={"static": True})


@jtu.register_pytree_with_keys_class
class LateKeyBagJ(_Bag):
    """register_pytree_with_keys_class via jax after ``import treeclone``."""


# Registered custom node types, for generic tests.
PAIR_TYPES = (PairJ, KeyedJ, PairT, PairWithKeysT, KeyedT, LatePairJ)
BAG_TYPES = (BagJ, KeyBagJ, BagT, KeyBagT, LateKeyBagJ)
STATIC_TYPES = (StaticJ, StaticT)


# --------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------


def _nest_list(depth: int, leaf: Any) -> Any:
    t = leaf
    for _ in range(depth):
        t = [t]
    return t


def _nest_mixed(depth: int) -> Any:
    t: Any = "bottom"
    for i in range(depth):
        kind = i % 5
        if kind == 0:
            t = [t, i]
        elif kind == 1:
            t = (i, t)
        elif kind == 2:
            t = {"k": t, "j": None}
        elif kind == 3:
            t = Point(t, i)
        else:
            t = PairJ(t, i, meta=f"m{i % 3}")
    return t


def _nest_custom(depth: int) -> Any:
    t: Any = 0
    for i in range(depth):
        t = (PairT, KeyedJ, DataT, LatePairJ)[i % 4](t, i)
    return t


def _wide_dict(n: int) -> dict[str, int]:
    keys = [f"k{i:05d}" for i in range(n)]
    random.Random(0).shuffle(keys)  # insertion order != sorted order
    return {k: i for i, k in enumerate(keys)}


def _diamond(depth: int) -> Any:
    t: Any = [Opaque("shared")]
    for _ in range(depth):
        t = [t, t]  # the very same object twice: a DAG, not a cycle
    return t


def _shared() -> Any:
    x = [1, 2]
    d = {"a": x}
    return {"first": x, "second": x, "d": d, "again": d}


def _ordered_dict() -> Any:
    return collections.OrderedDict([("z", 1), ("a", [2, 3]), ("m", None)])


def _defaultdict() -> Any:
    d: Any = collections.defaultdict(list)
    d["b"] = 1
    d["a"] = (2, 3)
    return d


def _defaultdict_dict() -> Any:
    d: Any = collections.defaultdict(dict)
    d[3] = {"y": 1, "x": 2}
    d[1] = None
    return d


def _all_nodes() -> Any:
    return {
        "list": [1, [2, ()], {}],
        "tuple": (3, None),
        "nt": Point(4, Empty()),
        "od": collections.OrderedDict([("q", 5), ("b", 6)]),
        "dd": _defaultdict(),
        "pairs": [t(7, 8, meta="p") for t in PAIR_TYPES],
        "bags": [t([9, 10], name="b") for t in BAG_TYPES],
        "data": [DataJ(11, 12), DataT(13, 14), LateDataJ(15, 16)],
        "static": [StaticJ("s"), StaticT(1)],
        "rdict": RegisteredDictJ(b=17, a=18),
    }


CORPUS: list[tuple[str, Callable[[], Any]]] = [
    # leaves of many types
    ("int", lambda: 1),
    ("float", lambda: 2.5),
    ("complex", lambda: 1 + 2j),
    ("bool", lambda: True),
    ("str", lambda: "hello"),
    ("bytes", lambda: b"bytes"),
    ("object", lambda: object()),
    ("opaque", lambda: Opaque(3)),
    ("function", lambda: len),
    ("lambda", lambda: lambda x: x),
    ("type", lambda: int),
    ("ellipsis", lambda: Ellipsis),
    ("frozenset", lambda: frozenset({1, 2})),
    ("set", lambda: {1, 2}),
    ("np_array", lambda: np.arange(6.0).reshape(2, 3)),
    ("np_scalar", lambda: np.float32(1.5)),
    ("np_0d", lambda: np.array(3)),
    ("jnp_array", lambda: jnp.ones((2, 2))),
    ("jnp_0d", lambda: jnp.array(1.0)),
    (
        "mixed_leaves",
        lambda: [1, 2.0, "s", b"b", None, np.zeros(2), jnp.arange(3), Opaque(), 1j, False],
    ),
    # empty containers / None
    ("none", lambda: None),
    ("empty_list", lambda: []),
    ("empty_tuple", lambda: ()),
    ("empty_dict", lambda: {}),
    ("nested_empties", lambda: [[], (), {}, None, [[()]], {"a": {}}, ([None],)]),
    ("list_of_nones", lambda: [None, None, None]),
    # builtin containers
    ("list", lambda: [1, 2, 3]),
    ("tuple", lambda: (1, "two", 3.0)),
    ("dict", lambda: {"b": 1, "a": 2, "c": 3}),
    ("dict_int_keys", lambda: {3: "c", 1: "a", 2: "b", -5: "neg"}),
    ("dict_mixed_sortable_keys", lambda: {2.5: 1, 1: 2, -3: 3, 7: 4, 0.25: 5, False: 6}),
    ("dict_tuple_keys", lambda: {(1, 2): "x", (0, 5): "y", (1,): "z"}),
    ("dict_nested", lambda: {"z": {"y": [1, {"x": 2}], "a": (3,)}, "a": None}),
    ("nested_mixed", lambda: [1, (2, [3, {"a": 4, "b": (5, None)}]), {"c": [[6]]}]),
    # namedtuples
    ("namedtuple", lambda: Point(1, 2)),
    ("namedtuple_empty", lambda: Empty()),
    ("namedtuple_nested", lambda: Outer(Point([1, 2], {"a": 3}), None, Point(Empty(), (4,)))),
    ("namedtuple_subclass", lambda: PointSub(1, [2])),
    # OrderedDict / defaultdict
    ("ordered_dict", _ordered_dict),
    ("ordered_dict_empty", lambda: collections.OrderedDict()),
    ("defaultdict", _defaultdict),
    ("defaultdict_dict_factory", _defaultdict_dict),
    ("defaultdict_empty", lambda: collections.defaultdict(int)),
    # builtin subclasses (leaves)
    ("dict_subclass", lambda: DictSub(a=1, b=[2])),
    ("list_subclass", lambda: ListSub([1, 2])),
    ("tuple_subclass", lambda: TupleSub((1, 2))),
    ("ordered_dict_subclass", lambda: OrderedDictSub(a=1)),
    ("defaultdict_subclass", lambda: DefaultDictSub(list, a=1)),
    ("subclasses_in_tree", lambda: {"d": DictSub(x=1), "l": [ListSub([1]), TupleSub((2,))]}),
    ("registered_dict_subclass", lambda: RegisteredDictJ(b=1, a=[2, 3])),
    # custom nodes, every registration function, through both modules
    ("pair_j", lambda: PairJ(1, [2, 3])),
    ("keyed_j", lambda: KeyedJ({"x": 1}, (2,), meta="k")),
    ("bag_j", lambda: BagJ([1, None, (2,)])),
    ("keybag_j", lambda: KeyBagJ([1, [2]], name="kb")),
    ("data_j", lambda: DataJ(np.ones(2), 0.5, name="dense", size=2)),
    ("static_j", lambda: StaticJ("cfg")),
    ("pair_t", lambda: PairT(1, {"b": 2, "a": 3})),
    ("pair_with_keys_t", lambda: PairWithKeysT([1], 2)),
    ("keyed_t", lambda: KeyedT(None, 2, meta="kt")),
    ("bag_t", lambda: BagT([(), 1, [2]])),
    ("keybag_t", lambda: KeyBagT([1, 2, 3], name="kbt")),
    ("data_t", lambda: DataT(jnp.zeros(3), [1, 2], activation="tanh")),
    ("static_t", lambda: StaticT(42)),
    ("late_pair_j", lambda: LatePairJ(1, (2, 3))),
    ("late_data_j", lambda: LateDataJ({"a": 1}, None)),
    ("late_keybag_j", lambda: LateKeyBagJ([1, {"z": 2}])),
    ("empty_custom", lambda: [BagJ([]), BagT([]), KeyBagT([])]),
    ("statics_in_list", lambda: [StaticJ(1), StaticT("a"), 5, StaticJ(1)]),
    ("custom_nested", lambda: PairT(BagJ([KeyedJ(1, 2), DataT(3, 4)]), LatePairJ(None, [5]))),
    ("all_node_kinds", _all_nodes),
    # sharing (DAGs are fine; no cycles here)
    ("shared_subtrees", _shared),
    ("diamond_10", lambda: _diamond(10)),
    # deep and wide
    ("deep_list_300", lambda: _nest_list(300, "leaf")),
    ("deep_mixed_300", lambda: _nest_mixed(300)),
    ("deep_custom_300", lambda: _nest_custom(300)),
    ("wide_dict_10000", lambda: _wide_dict(10_000)),
    ("wide_list_10000", lambda: list(range(10_000))),
    ("wide_tuple_of_nones_1000", lambda: (None,) * 1000),
]

CORPUS_IDS = [name for name, _ in CORPUS]
CORPUS_BY_ID = dict(CORPUS)

# Trees whose pairwise comparisons we skip for speed in O(n^2) tests.
BIG_IDS = frozenset({"wide_dict_10000", "wide_list_10000"})


class Rec:
    """An unregistered record (a leaf) capturing the arguments a mapped function received."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __repr__(self) -> str:
        return f"Rec{self.args!r}"
