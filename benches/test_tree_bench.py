"""Micro benchmarks: treeclone against jax.tree_util and optree, per tree and operation.

    pytest benches/ --benchmark-only -q

Each benchmark is in the group ``"{op}-{tree}"``, so pytest-benchmark prints the contenders
for one operation on one tree side by side. Speed claims in the docs come from
``tree_table.py`` (interleaved rounds in one process), not from these.
"""

from __future__ import annotations

import functools

import pytest

from benches.tree_ops import CONTENDERS, OPS, applies, check_agreement, make_call, module_for
from benches.trees import TREES


@functools.cache
def _tree(name: str):
    return TREES[name]()


def _module(contender: str):
    if contender == "optree":
        return pytest.importorskip("optree")
    return module_for(contender)


CASES = [
    pytest.param(tree, op, contender, id=f"{op}-{tree}-{contender}")
    for tree in TREES
    for op in OPS
    for contender in CONTENDERS
    if applies(contender, op)
]


@pytest.mark.parametrize("tree_name", list(TREES))
def test_treeclone_agrees_with_jax(tree_name):
    check_agreement(_tree(tree_name), module_for("treeclone"))


@pytest.mark.parametrize(("tree_name", "op", "contender"), CASES)
def test_bench(benchmark, tree_name, op, contender):
    call = make_call(contender, op, _tree(tree_name), _module(contender))
    benchmark.group = f"{op}-{tree_name}"
    benchmark.extra_info.update(tree=tree_name, op=op, contender=contender)
    benchmark(call.fn, *call.args, **call.kwargs)
