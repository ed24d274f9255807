"""Coverage-guided fuzzing of treeclone.tree_util against jax.tree_util.

Not a pytest module (tests/hostile/test_fuzz_smoke.py runs it for a few seconds). Usage:

    python tests/support/fuzz_tree.py [--seconds N] [--driver atheris|hypothesis] [--seed S]
    python tests/support/fuzz_tree.py --replay HEX_OR_FILE     # re-run one input, print its tree

Each input is a byte string, decoded (``decode``) into one or two pytrees (nested lists, tuples,
dicts of several key kinds, OrderedDicts, defaultdicts, None, namedtuples, custom nodes
registered through JAX and through treeclone, dataclasses, static nodes, ints, floats, strings,
numpy and JAX arrays, shared subtrees), an ``is_leaf`` choice (including predicates that raise
or return non-booleans) and a few parameters (leaf-count errors for unflatten, a prefix for
flatten_up_to). ``check`` then runs flatten, structure equality and hashing, unflatten (right
and wrong numbers of leaves), tree_map (one and two trees), key paths, flatten_up_to, pickling,
children and the treedef predicates through both modules and requires the same leaves (by
identity), equal structures (``treedef.to_jax() == jax_treedef``), the same reprs, and the same
exception type whenever JAX raises.

Drivers: ``atheris`` (libFuzzer; coverage of the Python code of the harness, treeclone's Python
layer and JAX's tree_util, not of the Rust core, which is not instrumented) when it is
installed, else ``hypothesis`` (random bytes, shrunk on failure). A finding prints a reproducer
(the input as hex, a ``--replay`` command and the decoded tree) and exits non-zero.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import pickle
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax._src.tree_util as jax_internal_tu  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.tree_util as jtu  # noqa: E402
import numpy as np  # noqa: E402
import treeclone.tree_util as tc  # noqa: E402
import trees  # noqa: E402

# --------------------------------------------------------------------------------------------
# extra node types: aux data of many kinds (unhashable, NaN, arrays)
# --------------------------------------------------------------------------------------------

AUX_VALUES: list[Any] = [
    0,
    "s",
    (1, "t"),
    None,
    [1, 2],  # unhashable
    {"k": 1},  # unhashable
    float("nan"),  # != itself
    np.arange(2),  # ambiguous truth value of ==
    frozenset({1}),
    1.0,  # == 1 and True
    True,
]


KNOWN_BUGS = False  # --known-bugs: also generate inputs that hit known divergences


class AuxNode:
    """One child per item, aux data from AUX_VALUES: fresh lists, dicts and arrays (equal, not
    identical), the others themselves (the one NaN object: equal to itself by identity only)."""

    def __init__(self, items: list, aux_index: int) -> None:
        self.items = list(items)
        self.aux_index = aux_index

    def __repr__(self) -> str:
        return f"AuxNode({self.items!r}, {self.aux_index})"


def _aux_node_flatten(n: AuxNode) -> tuple[tuple, Any]:
    aux = AUX_VALUES[n.aux_index]
    if isinstance(aux, (list, dict)):
        aux = type(aux)(aux)  # equal but not identical
    elif isinstance(aux, np.ndarray):
        aux = aux.copy()
    return tuple(n.items), aux


def _aux_node_unflatten(aux: Any, children: Any) -> AuxNode:
    for i, value in enumerate(AUX_VALUES):
        if value is aux or (type(value) is type(aux) and _safe_eq(value, aux)):
            return AuxNode(list(children), i)
    return AuxNode(list(children), 0)


def _safe_eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


tc.register_pytree_node(AuxNode, _aux_node_flatten, _aux_node_unflatten)

# --------------------------------------------------------------------------------------------
# decoding bytes into trees
# --------------------------------------------------------------------------------------------

JNP_ARRAY = jnp.arange(3.0)
FLOATS = [0.0, -0.0, 1.5, float("nan"), float("inf"), -float("inf"), 1e300, 2.0]
STRS = ["", "a", "b", "ab", "B", "é", "z\u0301", "\U0001f600", "\ud800", "0", "a" * 20]
INTS = [0, 1, -1, 2, 7, 2**63, -(2**70), 255]
KEY_STRS = ["a", "b", "c", "ab", "A", "é", "\U0001f600", "\ud800", "", "x1", "x10", "x2"]
PAIRS = trees.PAIR_TYPES
BAGS = trees.BAG_TYPES
NAMEDTUPLES = (trees.Point, trees.Outer, trees.Empty, trees.PointSub)
MAX_NODES = 48
MAX_DEPTH = 7


class Boom(Exception):
    pass


class Reader:
    """Reads small integers from the fuzz input; past its end every read returns 0."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        b = self.data[self.pos]
        self.pos += 1
        return b

    def below(self, n: int) -> int:
        return self.byte() % n if n > 1 else 0

    def pick(self, seq: Any) -> Any:
        return seq[self.below(len(seq))]


class Builder:
    def __init__(self, r: Reader) -> None:
        self.r = r
        self.nodes = 0
        self.built: list[tuple[Any, str]] = []  # subtrees (for sharing and is_leaf targets)

    def tree(self, depth: int = 0) -> tuple[Any, str]:
        r = self.r
        self.nodes += 1
        if depth >= MAX_DEPTH or self.nodes >= MAX_NODES:
            return self.leaf(r.below(8))
        tag = 10 + r.below(18) if depth < 2 else r.below(32)  # containers near the root
        if tag < 10:
            out = self.leaf(tag if tag < 8 else r.byte())
        elif tag < 20:
            out = self.container(tag - 10, depth)
        elif tag < 26:
            out = self.custom(tag - 20, depth)
        elif tag < 28 and self.built:
            out = self.built[r.below(len(self.built))]  # shared subtree (a DAG)
        else:
            out = self.leaf(r.byte())
        self.built.append(out)
        return out

    def children(self, depth: int, most: int = 4) -> tuple[list, list]:
        n = self.r.below(most + 1)
        kids = [self.tree(depth + 1) for _ in range(n)]
        return [k for k, _ in kids], [s for _, s in kids]

    def leaf(self, kind: int) -> tuple[Any, str]:
        r = self.r
        kind %= 20
        if kind == 0:
            v = r.pick(INTS)
            return v, repr(v)
        if kind == 1:
            i = r.below(len(FLOATS))
            return FLOATS[i], f"FLOATS[{i}]"
        if kind == 2:
            i = r.below(len(STRS))
            return STRS[i], f"STRS[{i}]"
        if kind == 3:
            return None, "None"
        if kind == 4:
            n = r.below(4)
            return np.arange(n, dtype=np.float32), f"np.arange({n}, dtype=np.float32)"
        if kind == 5:
            return JNP_ARRAY, "JNP_ARRAY"
        if kind == 6:
            v = bool(r.below(2))
            return v, repr(v)
        if kind == 7:
            v = r.byte()
            return trees.Opaque(v), f"trees.Opaque({v})"
        if kind == 8:
            return b"by", "b'by'"
        if kind == 9:
            return np.float32(1.5), "np.float32(1.5)"
        if kind == 10:
            return trees.DictSub(a=1), "trees.DictSub(a=1)"
        if kind == 11:
            return trees.ListSub([1]), "trees.ListSub([1])"
        if kind == 12:
            return trees.TupleSub((1, 2)), "trees.TupleSub((1, 2))"
        if kind == 13:
            return trees.OrderedDictSub(a=1), "trees.OrderedDictSub(a=1)"
        if kind == 14:
            return {1, 2}, "{1, 2}"
        if kind == 15:
            v = r.below(3)
            cls = r.pick(trees.STATIC_TYPES)
            return cls(v), f"trees.{cls.__name__}({v})"
        if kind == 16:
            return np.array(3), "np.array(3)"
        if kind == 17:
            return Ellipsis, "Ellipsis"
        if kind == 18:
            return 1j, "1j"
        return r.byte(), "<int>"

    def keys(self, n: int) -> tuple[list, list]:
        """n distinct dict keys of one of several kinds (some unsortable on purpose)."""
        r = self.r
        mode = r.below(10)
        keys: list = []
        srcs: list = []
        for _ in range(n):
            if mode <= 3:  # exact str keys (the cached fast path), some not UTF-8 encodable
                j = r.below(len(KEY_STRS))
                k, s = KEY_STRS[j], f"KEY_STRS[{j}]"
            elif mode == 4:
                k = r.below(9) - 4
                s = repr(k)
            elif mode == 5:  # floats, NaN included (each NaN a distinct key)
                j = r.below(len(FLOATS))
                k, s = FLOATS[j], f"FLOATS[{j}]"
                if isinstance(k, float) and math.isnan(k):
                    # NaN keys make the order inconsistent: JAX's std::stable_sort and Python's
                    # list.sort then disagree (test_hostile_table xfail "dict_with_nan_keys")
                    if not KNOWN_BUGS:
                        continue
                    k, s = float("nan"), "float('nan')"
            elif mode == 6:  # str and int: unsortable unless one kind only
                k = r.pick(["a", "b", 1, 2, 3])
                s = repr(k)
            elif mode == 7:
                k = (r.below(3), r.pick(["x", "y"]))
                s = repr(k)
            elif mode == 8:  # str subclass keys (not the fast path)
                j = r.below(len(KEY_STRS))
                k, s = KeyStr(KEY_STRS[j]), f"KeyStr(KEY_STRS[{j}])"
            else:  # bool, int and float keys that compare equal across types
                k = r.pick([True, False, 0, 1, 0.5, 2])
                s = repr(k)
            if any(k is x or _safe_eq(k, x) for x in keys):
                continue
            keys.append(k)
            srcs.append(s)
        return keys, srcs

    def container(self, kind: int, depth: int) -> tuple[Any, str]:
        r = self.r
        if kind in (0, 1):
            kids, srcs = self.children(depth)
            return kids, "[" + ", ".join(srcs) + "]"
        if kind in (2, 3):
            kids, srcs = self.children(depth)
            return tuple(kids), "(" + "".join(s + ", " for s in srcs) + ")"
        if kind in (4, 5, 6, 7, 8):
            keys, ksrcs = self.keys(r.below(6))
            vals = [self.tree(depth + 1) for _ in keys]
            items = ", ".join(f"({k}, {v[1]})" for k, v in zip(ksrcs, vals, strict=True))
            pairs = [(k, v[0]) for k, v in zip(keys, vals, strict=True)]
            if kind == 7:
                return collections.OrderedDict(pairs), f"collections.OrderedDict([{items}])"
            if kind == 8:
                factory = r.pick([list, dict, None])
                name = getattr(factory, "__name__", "None")
                return (
                    collections.defaultdict(factory, pairs),
                    f"collections.defaultdict({name}, [{items}])",
                )
            return dict(pairs), f"dict([{items}])"
        cls = r.pick(NAMEDTUPLES)
        n = len(cls._fields)
        kids = [self.tree(depth + 1) for _ in range(n)]
        return cls(*(k for k, _ in kids)), f"trees.{cls.__name__}({', '.join(s for _, s in kids)})"

    def custom(self, kind: int, depth: int) -> tuple[Any, str]:
        r = self.r
        if kind in (0, 1):
            cls = r.pick(PAIRS)
            a, b = self.tree(depth + 1), self.tree(depth + 1)
            meta = r.pick(["m0", "m1"])
            return cls(
                a[0], b[0], meta=meta
            ), f"trees.{cls.__name__}({a[1]}, {b[1]}, meta={meta!r})"
        if kind == 2:
            cls = r.pick(BAGS)
            kids, srcs = self.children(depth)
            name = r.pick(["n0", "n1"])
            return cls(kids, name=name), f"trees.{cls.__name__}([{', '.join(srcs)}], name={name!r})"
        if kind == 3:
            a, b = self.tree(depth + 1), self.tree(depth + 1)
            which = r.below(3)
            if which == 0:
                v = trees.DataJ(a[0], b[0], name=r.pick(["l0", "l1"]), size=r.below(2))
                return v, f"trees.DataJ({a[1]}, {b[1]}, name={v.name!r}, size={v.size})"
            if which == 1:
                v = trees.DataT(a[0], b[0], activation=r.pick(["relu", "tanh"]))
                return v, f"trees.DataT({a[1]}, {b[1]}, activation={v.activation!r})"
            v = trees.LateDataJ(a[0], b[0])
            return v, f"trees.LateDataJ({a[1]}, {b[1]})"
        if kind == 4:
            keys, ksrcs = self.keys(r.below(4))
            keys = [k for k in keys if isinstance(k, str)]
            vals = [self.tree(depth + 1) for _ in keys]
            items = ", ".join(f"({k!r}, {v[1]})" for k, v in zip(keys, vals, strict=True))
            pairs = [(k, v[0]) for k, v in zip(keys, vals, strict=True)]
            return trees.RegisteredDictJ(pairs), f"trees.RegisteredDictJ([{items}])"
        kids, srcs = self.children(depth, most=3)
        i = r.below(len(AUX_VALUES))
        return AuxNode(kids, i), f"AuxNode([{', '.join(srcs)}], {i})"


class KeyStr(str):
    """A str subclass used as a dict key."""


@dataclasses.dataclass
class Case:
    tree: Any
    src: str
    other: Any
    other_src: str
    is_leaf_code: int
    is_leaf_target: Any
    takes_path: bool
    leaf_delta: int
    leaves_as: int
    prefix_code: int


def decode(data: bytes) -> Case:
    r = Reader(data)
    b = Builder(r)
    tree, src = b.tree()
    is_leaf_code = r.below(16)
    target = b.built[r.below(len(b.built))][0] if b.built else None
    takes_path = r.below(4) == 0
    leaf_delta = r.pick([0, 0, 0, 0, -1, 1, -2, 3])
    leaves_as = r.below(4)
    prefix_code = r.below(8)
    b2 = Builder(r)
    b2.built = b.built
    other, other_src = b2.tree() if r.below(2) else (tree, src)
    return Case(
        tree,
        src,
        other,
        other_src,
        is_leaf_code,
        target,
        takes_path,
        leaf_delta,
        leaves_as,
        prefix_code,
    )


def make_is_leaf(code: int, target: Any):
    """A fresh predicate (those with state count their calls), or None."""
    if code < 6:
        return None
    if code == 6:
        return lambda x: isinstance(x, list)
    if code == 7:
        return lambda x: isinstance(x, tuple)
    if code == 8:
        return lambda x: isinstance(x, dict)
    if code == 9:
        return lambda x: x is target
    if code == 10:
        return lambda x: hasattr(x, "_fields")
    if code == 11:
        return lambda x: type(x) in PAIRS
    if code == 12:
        calls = [0]

        def raising(x):
            calls[0] += 1
            if calls[0] == 3:
                raise Boom("is_leaf")
            return False

        return raising
    if code == 13:
        return lambda x: np.bool_(isinstance(x, list))
    if code == 14:
        return lambda x: 1 if x is target else 0
    return lambda x: None


def with_path(pred):
    if pred is None:
        return None
    return lambda path, x: pred(x)


# --------------------------------------------------------------------------------------------
# comparing the two modules
# --------------------------------------------------------------------------------------------


class Finding(AssertionError):
    pass


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001
        return "err", exc


def same_outcome(what: str, tc_fn, jax_fn, compare=None):
    """Run both; JAX raising => treeclone raises the same type; else ``compare(tc, jax)``."""
    jk, jv = outcome(jax_fn)
    tk, tv = outcome(tc_fn)
    if jk == "err":
        if tk != "err":
            raise Finding(f"{what}: JAX raised {jv!r}, treeclone returned {tv!r}")
        if type(tv) is not type(jv):
            raise Finding(f"{what}: treeclone raised {tv!r}, JAX raised {jv!r}")
        return None
    if tk == "err":
        raise Finding(f"{what}: treeclone raised {tv!r}, JAX returned {jv!r}") from tv
    if compare is not None:
        compare(tv, jv)
    return tv, jv


def same_objects(what: str, actual: list, expected: list) -> None:
    if len(actual) != len(expected):
        raise Finding(f"{what}: {len(actual)} leaves, JAX has {len(expected)}")
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if a is not e:
            raise Finding(f"{what}: leaf {i} {a!r} is not JAX's {e!r}")


def same_treedef(what: str, td, jd, jax_again) -> None:
    """``jax_again()`` flattens the same input with JAX once more: when JAX's own two treedefs
    are not equal (aux data not equal to itself, such as a fresh NaN), only reprs are compared."""
    if repr(td) != repr(jd):
        raise Finding(f"{what}: repr {td!r} != JAX's {jd!r}")
    if (td.num_leaves, td.num_nodes) != (jd.num_leaves, jd.num_nodes):
        raise Finding(f"{what}: sizes {(td.num_leaves, td.num_nodes)} != JAX's")
    as_jax = td.to_jax()
    if repr(as_jax) != repr(jd) or (_safe_eq(jax_again(), jd) and not _safe_eq(as_jax, jd)):
        raise Finding(f"{what}: to_jax() {as_jax!r} != JAX's {jd!r}")


def _aux_same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and bool((a == b).all())
    return _safe_eq(a, b)


def same_tree(what: str, actual: Any, expected: Any) -> None:
    """Same types, dict key orders, aux data and leaves (by identity) all the way down."""
    stack = [(actual, expected, "root")]
    while stack:
        a, e, where = stack.pop()
        if type(a) is not type(e):
            raise Finding(f"{what} at {where}: {type(a).__name__} != JAX's {type(e).__name__}")
        if jtu.all_leaves([e]):
            if a is not e:
                raise Finding(f"{what} at {where}: leaf {a!r} is not JAX's {e!r}")
            continue
        if e is None:
            continue
        if (
            isinstance(e, dict)
            and type(e) in (dict, collections.OrderedDict)
            or type(e) is (collections.defaultdict)
        ):
            if [k for k in a] != [k for k in e] and list(map(repr, a)) != list(map(repr, e)):
                raise Finding(f"{what} at {where}: keys {list(a)} != JAX's {list(e)}")
            if type(e) is collections.defaultdict and a.default_factory is not e.default_factory:
                raise Finding(f"{what} at {where}: default_factory differs")
            pairs = zip(e.items(), a.values(), strict=True)
            stack.extend((av, ev, f"{where}[{k!r}]") for (k, ev), av in pairs)
            continue
        a_kids, a_aux = jax_internal_tu.flatten_one_level(a)
        e_kids, e_aux = jax_internal_tu.flatten_one_level(e)
        a_kids, e_kids = list(a_kids), list(e_kids)
        if len(a_kids) != len(e_kids) or not _aux_same(a_aux, e_aux):
            raise Finding(f"{what} at {where}: node {a!r} != JAX's {e!r}")
        kids = enumerate(zip(a_kids, e_kids, strict=True))
        stack.extend((x, y, f"{where}.{i}") for i, (x, y) in kids)


def check(data: bytes) -> None:
    c = decode(data)
    tree = c.tree

    def pred():
        return make_is_leaf(c.is_leaf_code, c.is_leaf_target)

    # flatten
    res = same_outcome(
        "tree_flatten",
        lambda: tc.tree_flatten(tree, is_leaf=pred()),
        lambda: jtu.tree_flatten(tree, is_leaf=pred()),
    )
    if res is None:
        return
    (leaves, td), (jleaves, jd) = res
    same_objects("tree_flatten", leaves, jleaves)
    same_treedef("tree_flatten", td, jd, lambda: jtu.tree_structure(tree, is_leaf=pred()))
    same_outcome(
        "tree_leaves",
        lambda: tc.tree_leaves(tree, is_leaf=pred()),
        lambda: jtu.tree_leaves(tree, is_leaf=pred()),
        lambda a, e: same_objects("tree_leaves", a, e),
    )

    # structure equality and hashing: a second flatten of the same tree, and another tree
    td2, jd2 = tc.tree_structure(tree, is_leaf=pred()), jtu.tree_structure(tree, is_leaf=pred())
    same_outcome("treedef == (same tree)", lambda: td == td2, lambda: jd == jd2, _equal("=="))
    same_outcome("treedef != (same tree)", lambda: td != td2, lambda: jd != jd2, _equal("!="))
    if _safe_eq(td, td2):
        h = outcome(lambda: hash(td) == hash(td2))
        if h[0] == "ok" and not h[1]:
            raise Finding("equal treedefs with different hashes")
    other = same_outcome(
        "tree_structure(other)",
        lambda: tc.tree_structure(c.other, is_leaf=pred()),
        lambda: jtu.tree_structure(c.other, is_leaf=pred()),
    )
    if other is not None:
        tdo, jdo = other
        same_outcome(
            "treedef == (other)",
            lambda: td == tdo,
            lambda: jd == jdo,
            _equal("=="),
        )
        same_outcome(
            "flatten_up_to(other)",
            lambda: td.flatten_up_to(c.other),
            lambda: jd.flatten_up_to(c.other),
            lambda a, e: same_objects("flatten_up_to(other)", a, e),
        )

    # unflatten with the right or a wrong number of leaves, from several kinds of iterables
    n = max(0, len(leaves) + c.leaf_delta)
    given = (list(leaves) + [trees.Opaque("extra")] * n)[:n]

    def leaves_iter():
        return [list, tuple, iter, lambda x: (y for y in x)][c.leaves_as](given)

    same_outcome(
        "tree_unflatten",
        lambda: tc.tree_unflatten(td, leaves_iter()),
        lambda: jtu.tree_unflatten(jd, leaves_iter()),
        lambda a, e: same_tree("tree_unflatten", a, e),
    )

    # tree_map over one and two trees
    same_outcome(
        "tree_map",
        lambda: tc.tree_map(lambda x: x, tree, is_leaf=pred()),
        lambda: jtu.tree_map(lambda x: x, tree, is_leaf=pred()),
        lambda a, e: same_tree("tree_map", a, e),
    )
    same_outcome(
        "tree_map(other)",
        lambda: tc.tree_map(lambda x, y: (x, y), tree, c.other, is_leaf=pred()),
        lambda: jtu.tree_map(lambda x, y: (x, y), tree, c.other, is_leaf=pred()),
        lambda a, e: same_tree("tree_map(other)", a, e),
    )

    # key paths
    def path_pred():
        return with_path(pred()) if c.takes_path else pred()

    same_outcome(
        "tree_flatten_with_path",
        lambda: tc.tree_flatten_with_path(
            tree, is_leaf=path_pred(), is_leaf_takes_path=c.takes_path
        ),
        lambda: jtu.tree_flatten_with_path(
            tree, is_leaf=path_pred(), is_leaf_takes_path=c.takes_path
        ),
        lambda a, e: _same_paths(
            a,
            e,
            lambda: jtu.tree_flatten_with_path(
                tree, is_leaf=path_pred(), is_leaf_takes_path=c.takes_path
            )[1],
        ),
    )
    same_outcome(
        "tree_map_with_path",
        lambda: tc.tree_map_with_path(lambda p, x: x, tree, is_leaf=pred()),
        lambda: jtu.tree_map_with_path(lambda p, x: x, tree, is_leaf=pred()),
        lambda a, e: same_tree("tree_map_with_path", a, e),
    )

    # flatten_up_to with a prefix of the tree's structure
    def prefix():
        return make_is_leaf(6 + c.prefix_code, c.is_leaf_target)

    pre = same_outcome(
        "prefix tree_structure",
        lambda: tc.tree_structure(tree, is_leaf=prefix()),
        lambda: jtu.tree_structure(tree, is_leaf=prefix()),
    )
    if pre is not None:
        same_outcome(
            "flatten_up_to(prefix)",
            lambda: pre[0].flatten_up_to(tree),
            lambda: pre[1].flatten_up_to(tree),
            lambda a, e: same_objects("flatten_up_to(prefix)", a, e),
        )

    # pickling, children, predicates
    same_outcome(
        "pickle",
        lambda: repr(pickle.loads(pickle.dumps(td))),
        lambda: repr(pickle.loads(pickle.dumps(jd))),
        _equal("pickled repr"),
    )
    same_outcome(
        "children",
        lambda: [repr(x) for x in tc.treedef_children(td)],
        lambda: [repr(x) for x in jtu.treedef_children(jd)],
        _equal("children reprs"),
    )
    same_outcome(
        "treedef_is_leaf",
        lambda: (tc.treedef_is_leaf(td), tc.treedef_is_strict_leaf(td)),
        lambda: (jtu.treedef_is_leaf(jd), jax_internal_tu.treedef_is_strict_leaf(jd)),
        _equal("treedef_is_leaf"),
    )


def _equal(what: str):
    def compare(a, e):
        if a != e:
            raise Finding(f"{what}: treeclone {a!r} != JAX {e!r}")

    return compare


def _same_paths(a, e, jax_again) -> None:
    (pairs, td), (jpairs, jd) = a, e
    same_objects("tree_flatten_with_path", [x for _, x in pairs], [x for _, x in jpairs])
    if [repr(p) for p, _ in pairs] != [repr(p) for p, _ in jpairs]:
        raise Finding(f"key paths {[p for p, _ in pairs]} != JAX's {[p for p, _ in jpairs]}")
    same_treedef("tree_flatten_with_path", td, jd, jax_again)


# --------------------------------------------------------------------------------------------
# drivers
# --------------------------------------------------------------------------------------------


def reproducer(data: bytes) -> str:
    c = decode(data)
    return (
        f"input (hex): {data.hex()}\n"
        f"replay: python tests/support/fuzz_tree.py --replay {data.hex()}\n"
        f"tree (shared subtrees are repeated): {c.src}\n"
        f"other: {c.other_src}\n"
        f"is_leaf code {c.is_leaf_code} (see make_is_leaf), takes_path={c.takes_path}, "
        f"leaf_delta={c.leaf_delta}, leaves_as={c.leaves_as}, prefix_code={c.prefix_code}"
    )


def check_in_thread(data: bytes) -> None:
    """``check(data)`` on a short-lived thread, re-raising what it raised.

    jaxlib leaks recursion depth (Py_EnterRecursiveCall without a matching leave) when an
    exception, e.g. from ``is_leaf``, unwinds its traversal; after a few thousand such inputs
    every call on that thread fails with RecursionError. Each thread has its own counter, so a
    fresh thread per input keeps the leak from accumulating.
    """
    result: list[BaseException] = []

    def target() -> None:
        try:
            check(data)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            result.append(exc)

    t = threading.Thread(target=target, name="fuzz-input")
    t.start()
    t.join()
    if result:
        raise result[0]


def one_input(data: bytes) -> None:
    try:
        check_in_thread(data)
    except Finding:
        sys.stderr.write("\n==== FINDING ====\n" + reproducer(data) + "\n")
        raise


def _instrument_module(atheris: Any, module: Any) -> None:
    import inspect

    for value in list(vars(module).values()):
        members = [value]
        if inspect.isclass(value) and value.__module__ == module.__name__:
            members = [m for m in vars(value).values() if inspect.isfunction(m)]
        for fn in members:
            if inspect.isfunction(fn) and fn.__module__ == module.__name__:
                try:
                    atheris.instrument_func(fn)
                except Exception:  # noqa: BLE001 - some functions cannot be instrumented
                    pass


def run_atheris(seconds: float, seed: int, corpus: str | None) -> int:
    import atheris

    args = [
        sys.argv[0],
        f"-max_total_time={max(1, int(seconds))}",
        f"-seed={seed}",
        "-max_len=512",
        "-timeout=30",
        "-rss_limit_mb=4096",
        "-print_final_stats=1",
        # crash files go to the temp directory, not the working directory
        "-artifact_prefix=" + os.path.join(tempfile.gettempdir(), "treeclone-fuzz-"),
    ]
    if corpus:
        os.makedirs(corpus, exist_ok=True)
        args.append(corpus)
    import jax._src.tree_util
    import treeclone._jax_compat
    import treeclone._known_flatten

    # the harness (decoding: which shapes were built) and the Python code on both sides
    python_side = (treeclone._jax_compat, treeclone._known_flatten, jax._src.tree_util)
    for module in (sys.modules[__name__], tc, *python_side):
        _instrument_module(atheris, module)
    atheris.Setup(args, one_input)
    atheris.Fuzz()  # exits the process: 0 when the time is up, non-zero on a finding
    return 0


def run_hypothesis(seconds: float, seed: int) -> int:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    count = [0]
    last_failing: list[bytes] = []

    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
    )
    @given(st.binary(min_size=8, max_size=512))
    def prop(data: bytes) -> None:
        count[0] += 1
        try:
            check_in_thread(data)
        except Finding:
            last_failing[:] = [data]
            raise

    end = time.monotonic() + seconds
    batch = 0
    while time.monotonic() < end:
        try:
            hseed(seed * 100_003 + batch)(prop)()
        except Finding:
            # hypothesis re-raises on the shrunk example, which was the last to fail
            sys.stderr.write("\n==== FINDING ====\n" + reproducer(last_failing[0]) + "\n")
            raise
        batch += 1
    print(f"hypothesis driver: {count[0]} executions in {seconds:.0f} s, no finding")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--driver", choices=["atheris", "hypothesis"], default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--corpus", default=None, help="atheris corpus directory (optional)")
    parser.add_argument("--replay", default=None, help="hex input or a file with the bytes")
    parser.add_argument("--known-bugs", action="store_true", help="generate known divergences")
    args = parser.parse_args(argv)
    global KNOWN_BUGS
    KNOWN_BUGS = args.known_bugs
    if args.replay is not None:
        if os.path.exists(args.replay):
            with open(args.replay, "rb") as f:
                data = f.read()
        else:
            data = bytes.fromhex(args.replay)
        print(reproducer(data))
        one_input(data)
        print("no finding")
        return 0
    driver = args.driver
    if driver is None:
        try:
            import atheris  # noqa: F401

            driver = "atheris"
        except ImportError:
            driver = "hypothesis"
    print(f"fuzz_tree: driver={driver} seconds={args.seconds} seed={args.seed}", flush=True)
    if driver == "atheris":
        return run_atheris(args.seconds, args.seed, args.corpus)
    return run_hypothesis(args.seconds, args.seed)


if __name__ == "__main__":
    sys.exit(main())
