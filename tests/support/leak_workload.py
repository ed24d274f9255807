"""Many flatten/unflatten calls, success and error paths: memory and refcounts must stay flat.

``run(total_calls)`` makes about ``total_calls`` treeclone calls in rounds of ``CALLS_PER_ROUND``
(see ``one_round``), a tenth of them as a warm-up, then checks that

* the resident set size grew by less than ``rss_slack_mib`` between the end of the warm-up and
  the end (``/proc/self/statm``; gc.collect() before each reading), and
* ``sys.getrefcount`` of sample leaves, aux data objects, node types, exception types and the
  treedef are back where they were after the warm-up.

Run it in a subprocess (tests/hostile/test_leaks.py does).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import random
import sys
import time

import jax.tree_util as jtu
import treeclone._native as native
import treeclone.tree_util as tc


class Opaque:
    def __init__(self, tag):
        self.tag = tag


class Aux:
    """Hashable aux data whose equality is by identity."""


AUX = Aux()


class Node:
    def __init__(self, a, b):
        self.a, self.b = a, b


tc.register_pytree_node(Node, lambda n: ((n.a, n.b), AUX), lambda aux, ch: Node(*ch))


@dataclasses.dataclass
class Data:
    w: object
    b: object
    name: str = "dense"


tc.register_dataclass(Data, data_fields=["w", "b"], meta_fields=["name"])


class KeyedBag:
    def __init__(self, items):
        self.items = list(items)


tc.register_pytree_with_keys(
    KeyedBag,
    lambda n: ([(jtu.SequenceKey(i), x) for i, x in enumerate(n.items)], "bag"),
    lambda aux, ch: KeyedBag(ch),
    lambda n: (n.items, "bag"),
)

Point = collections.namedtuple("Point", "x y")


class Boom(Exception):
    pass


class Raising:
    """A node whose flatten function raises."""


def _raise(_):
    raise Boom("flatten exploded")


tc.register_pytree_node(Raising, _raise, lambda aux, ch: Raising())


class BadUnflatten:
    def __init__(self, v):
        self.v = v


def _bad_unflatten(aux, children):
    raise Boom("unflatten exploded")


tc.register_pytree_node(BadUnflatten, lambda n: ((n.v,), None), _bad_unflatten)

LEAF = Opaque("leaf")
OTHER_LEAF = Opaque("other")
RAISING = Raising()
NODE_TYPES = (Node, Data, KeyedBag, Point, Raising, BadUnflatten)
CALLS_PER_ROUND = 16


def make_tree():
    return {
        "params": Node(LEAF, [1.5, Data(OTHER_LEAF, (LEAF, None))]),
        "state": Point(KeyedBag([LEAF, 2]), {"b": 3, "a": (LEAF,)}),
        "step": 7,
    }


TREE = make_tree()
LEAVES, TREEDEF = tc.tree_flatten(TREE)
BAD_UNFLATTEN_DEF = tc.tree_structure([BadUnflatten(1), 2])
CYCLE = [1, {"k": None}]
CYCLE[1]["k"] = CYCLE


def _expect(exc_type, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type:
        return
    raise AssertionError(f"{fn!r} did not raise {exc_type.__name__}")


def _is_tuple(x):
    return isinstance(x, tuple)


def _raising_is_leaf(x):
    if x is LEAF:
        raise Boom("is_leaf exploded")
    return False


def one_round(rng: random.Random) -> None:
    """CALLS_PER_ROUND treeclone calls, a third of them on error paths."""
    leaves, td = tc.tree_flatten(TREE)  # 1
    assert leaves[0] is LEAF or leaves[0] == 2 or leaves[0] is not None
    rebuilt = tc.tree_unflatten(td, leaves)  # 2
    assert type(rebuilt["params"]) is Node
    mapped = tc.tree_map(lambda x: x, TREE)  # 3
    assert mapped["step"] == 7
    tc.tree_map(lambda x, y: y, TREE, mapped)  # 4
    up_to = TREEDEF.flatten_up_to(TREE)  # 5
    assert len(up_to) == len(LEAVES)
    pairs, _ = tc.tree_flatten_with_path(TREE)  # 6
    assert len(pairs) == len(LEAVES)
    tc.tree_leaves(TREE, is_leaf=_is_tuple)  # 7
    assert tc.tree_structure(make_tree()) == TREEDEF  # 8
    hash(td)
    d = {f"k{rng.randrange(10**6)}": i for i in range(rng.randrange(1, 9))}
    tc.tree_leaves({"fresh": d})  # 9: fresh keys churn the key-order cache
    tc.tree_leaves(Point([LEAF], (OTHER_LEAF,)))  # 10
    # error paths
    _expect(ValueError, td.unflatten, leaves[:-1])  # 11: too few leaves
    _expect(ValueError, tc.tree_unflatten, td, [*leaves, LEAF])  # 12: too many leaves
    _expect(Boom, tc.tree_flatten, [1, {"x": RAISING}])  # 13: raising flatten
    _expect(Boom, BAD_UNFLATTEN_DEF.unflatten, [LEAF, OTHER_LEAF])  # 14: raising unflatten
    _expect(Boom, tc.tree_leaves, TREE, is_leaf=_raising_is_leaf)  # 15: raising is_leaf
    _expect(ValueError, tc.tree_flatten, CYCLE)  # 16: cycle


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _refcounts() -> dict[str, int]:
    native.clear_key_order_cache()
    gc.collect()
    samples = {
        "LEAF": LEAF,
        "OTHER_LEAF": OTHER_LEAF,
        "AUX": AUX,
        "RAISING": RAISING,
        "TREE": TREE,
        "TREEDEF": TREEDEF,
        "Boom": Boom,
        "'dense'": "dense",
        **{t.__name__: t for t in NODE_TYPES},
    }
    return {name: sys.getrefcount(obj) for name, obj in samples.items()}


def run(total_calls: int, rss_slack_mib: float = 8.0, seed: int = 0) -> dict:
    rng = random.Random(seed)
    rounds = max(1, total_calls // CALLS_PER_ROUND)
    warmup = max(1, rounds // 10)
    t0 = time.perf_counter()
    for _ in range(warmup):
        one_round(rng)
    before_refs = _refcounts()
    before_rss = rss_bytes()
    for _ in range(rounds - warmup):
        one_round(rng)
    after_refs = _refcounts()
    after_rss = rss_bytes()
    elapsed = time.perf_counter() - t0
    growth_mib = (after_rss - before_rss) / 2**20
    report = {
        "calls": rounds * CALLS_PER_ROUND,
        "measured_calls": (rounds - warmup) * CALLS_PER_ROUND,
        "rss_before_mib": round(before_rss / 2**20, 2),
        "rss_growth_mib": round(growth_mib, 3),
        "seconds": round(elapsed, 1),
    }
    changed = {
        k: (before_refs[k], after_refs[k]) for k in before_refs if before_refs[k] != after_refs[k]
    }
    assert not changed, f"refcounts changed (before, after): {changed}; {report}"
    assert growth_mib < rss_slack_mib, f"RSS grew by {growth_mib:.2f} MiB; {report}"
    return report


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 300_000))
