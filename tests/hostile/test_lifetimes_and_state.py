"""Objects the core keeps or rebuilds: no class kept alive, no tampered state accepted.

- The per-type classification cache holds its types weakly: a class used once (a leaf type,
  a namedtuple made per call) is collected as it is without treeclone, as JAX lets it be.
- A pickled treedef whose state was tampered with is refused when it is loaded, with a
  ValueError or TypeError, never accepted and left to fail later (or reach a Rust panic).
"""

from __future__ import annotations

import collections
import gc
import pickle
import weakref

import pytest
import treeclone.tree_util as tc
from treeclone import _native


def test_classification_cache_keeps_no_class_alive():
    def use_once():
        Leafy = type("Leafy", (), {})
        Pair = collections.namedtuple("Pair", "a b")
        tc.tree_leaves([Leafy(), Pair(1, Leafy())])
        return weakref.ref(Leafy), weakref.ref(Pair)

    refs = use_once()
    gc.collect()
    assert all(r() is None for r in refs)


def test_a_new_class_at_a_reused_address_is_classified_afresh():
    # Many short-lived classes: some land at the address of a dead one; each must still be
    # classified by what it is (every other one is a namedtuple, hence a node).
    for i in range(200):
        if i % 2:
            cls = collections.namedtuple(f"P{i}", "a")
            assert tc.tree_leaves(cls(1)) == [1]
        else:
            cls = type(f"L{i}", (), {})
            obj = cls()
            assert tc.tree_leaves(obj) == [obj]
        del cls
        # The young generations only: the class was made in this iteration. A full collection
        # walks every object the test process holds (seconds each, late in a long run).
        gc.collect(1)


def _state():
    return tc.tree_structure({"a": [1, (2, None)], "b": 3}).__reduce__()[1][0]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda s: s.__setitem__(-1, ("dict", 2, ["a"], dict)),  # keys do not match the arity
        lambda s: s.__setitem__(-1, ("dict", 5, ["a", "b", "c", "d", "e"], dict)),  # too many
        lambda s: s.__setitem__(0, ("leaf", 3, None, None)),  # a leaf with children
        lambda s: s.__setitem__(-1, ("list", 2, None, dict)),  # kind does not match the type
        lambda s: s.__setitem__(-1, ("dict", 2, ["a", "b"], 42)),  # not a type
        lambda s: s.__setitem__(-1, ("dict", 2)),  # not a 4-tuple
        lambda s: s.__setitem__(-1, ("frobnicate", 2, None, dict)),  # unknown kind
        lambda s: s.append(("leaf", 0, None, None)),  # two roots
        lambda s: s.clear(),  # no root
        lambda s: s.__setitem__(-1, ("none", 2, None, type(None))),  # None with children
    ],
)
def test_tampered_pickle_state_is_refused_at_load(tamper):
    state = _state()
    tamper(state)
    with pytest.raises((ValueError, TypeError)):
        _native._treedef_from_state(state)


def test_untampered_pickle_state_loads():
    td = tc.tree_structure({"a": [1, (2, None)], "b": 3})
    assert pickle.loads(pickle.dumps(td)) == td
    assert _native._treedef_from_state(_state()) == td
