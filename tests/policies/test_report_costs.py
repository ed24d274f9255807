"""Reports of many in-place changes cost O(changes), not O(changes x width) (issue 57).

Naming child ``j`` of a node rebuilt the node's whole list of keys, once per named child: the
MutationWarning (clone, the default), strict's MutationError and vmap's placement of N changed
entries of one dict of N took O(N^2) (4,000 keys: 8.8 s against jax.jit's 0.28 s). The keys
of each node are now made once per report (``treeclone._effects.tree.ChildKeys``). These tests
count that work and check the report's contents for a large N; they time nothing
(benches/mutation_report_scaling.py prints the times at several sizes).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import treeclone as tc

N = 1500


def _replace_all(d: dict) -> int:
    for k in list(d):
        d[k] = d[k] + 1
    return 0


def fresh() -> Callable[[dict], int]:
    """A new function each time: each call is traced afresh (jit's cache is per function)."""
    return lambda d: _replace_all(d)


def state(n: int = N) -> dict:
    return {f"k{i:05d}": np.ones(2, np.float32) for i in range(n)}


def _count_child_keys(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts each call of ``child_keys`` (the keys of one node's children) from any of
    treeclone's modules."""
    from treeclone._effects import tree

    original, calls = tree.child_keys, [0]

    def counting(*args: Any) -> Any:
        calls[0] += 1
        return original(*args)

    for name, module in list(sys.modules.items()):
        if name.startswith("treeclone") and getattr(module, "child_keys", None) is original:
            monkeypatch.setattr(module, "child_keys", counting)
    return calls


def _strict(run: Callable[[dict], Any]) -> Callable[[dict], Any]:
    def raising(d: dict) -> None:
        with pytest.raises(tc.MutationError):
            run(d)

    return raising


def _warned(d: dict) -> None:
    with pytest.warns(tc.MutationWarning):
        tc.jit(fresh())(d)


CALLS = {
    "jit-clone-warning": _warned,
    "jit-strict": _strict(lambda d: tc.jit(fresh(), policy="strict")(d)),
    "vmap-alias": lambda d: tc.vmap(fresh(), policy="alias")(d),
    "vmap-strict": _strict(lambda d: tc.vmap(fresh(), policy="strict")(d)),
    "cond-strict": _strict(lambda d: tc.cond(True, fresh(), fresh(), d, policy="strict")),
    "grad-strict": _strict(
        lambda d: tc.grad(lambda d: _replace_all(d) + d["k00000"].sum(), policy="strict")(d)
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_naming_n_changed_entries_makes_the_dicts_keys_once(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_child_keys(monkeypatch)
    CALLS[name](state())
    assert calls[0] <= 4, f"{calls[0]} key lists made for one dict of {N} entries"


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.startswith("  ")]


def test_the_warning_for_n_discarded_changes_names_each_entry_once() -> None:
    d = state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tc.MutationWarning)
        tc.jit(fresh())(d)
    (warning,) = [w for w in caught if issubclass(w.category, tc.MutationWarning)]
    assert _lines(str(warning.message)) == [f"d[{k!r}]: replaced" for k in sorted(d)]
    assert all((v == 1).all() for v in d.values())  # clone: the caller's dict is untouched


def test_strict_names_each_of_n_unreturned_changes_once() -> None:
    d = state()
    with pytest.raises(tc.MutationError) as raised:
        tc.jit(fresh(), policy="strict")(d)
    assert _lines(str(raised.value)) == [f"d[{k!r}]: replaced" for k in sorted(d)]


class _Bag:
    """A node registered without keys, each child held in an attribute of its own."""

    def __init__(self, values: list) -> None:
        for i, v in enumerate(values):
            setattr(self, f"a{i:04d}", v)

    def children(self) -> list:
        return list(vars(self).values())


tc.tree_util.register_pytree_node(
    _Bag,
    lambda b: (b.children(), len(vars(b))),
    lambda n, children: _Bag(list(children)),
)


def test_a_keyless_node_names_each_changed_child_by_its_attribute() -> None:
    def replace(bag: _Bag) -> int:
        for name in list(vars(bag)):
            setattr(bag, name, getattr(bag, name) + 1)
        return 0

    bag = _Bag([np.ones(2, np.float32) for _ in range(300)])
    with pytest.raises(tc.MutationError) as raised:
        tc.jit(replace, policy="strict")(bag)
    assert _lines(str(raised.value)) == [f"bag.a{i:04d}: replaced" for i in range(300)]
