"""The tree operations benchmarked: one ``BoundCall`` per (contender, operation, tree).

Shared by ``test_tree_bench.py`` and ``tree_table.py`` so both measure exactly the same calls.

Operations:

``flatten``           ``tree_flatten(tree)``.
``unflatten``         ``tree_unflatten(treedef, leaves)`` with both computed beforehand.
``tree_map``          ``tree_map(identity, tree)``.
``repeated_flatten``  flattening a tree whose structure is already known, as a training loop
                      does every step: treeclone uses ``treedef.flatten_up_to(tree)`` on a
                      treedef computed once; jax and optree have no faster path than
                      ``tree_flatten(tree)`` again. jax's own ``treedef.flatten_up_to`` is
                      measured as the extra contender ``jax-flatten_up_to``.

``floor`` is a reference, not a contender: for ``unflatten``, the least work any unflatten
must do, creating the same Python objects by the shortest path (``_native.unflatten_floor``:
raw CPython calls, no checks beyond memory safety). treeclone's unflatten is reported as a
ratio to it.

Every call is made as ``fn(*args, **kwargs)`` with the function and its arguments bound
beforehand, so no contender pays for a Python wrapper frame that another does not.
"""

from __future__ import annotations

import importlib
from typing import Any

from treeclone.bench.timing import BoundCall

OPS = ("flatten", "unflatten", "tree_map", "repeated_flatten")
CONTENDERS = ("treeclone", "jax", "jax-flatten_up_to", "optree", "floor")

# optree's defaults, spelled out: JAX treats None as an empty node, not a leaf.
_OPTREE_KW = {"none_is_leaf": False, "namespace": ""}


def identity(x: Any) -> Any:
    return x


def module_for(contender: str) -> Any:
    """The module a contender calls into (raises ImportError if it is not installed)."""
    if contender == "treeclone":
        return importlib.import_module("treeclone.tree_util")
    if contender in ("jax", "jax-flatten_up_to"):
        return importlib.import_module("jax.tree_util")
    if contender == "optree":
        return importlib.import_module("optree")
    if contender == "floor":
        return importlib.import_module("treeclone._native")
    raise ValueError(f"unknown contender {contender!r}")


def applies(contender: str, op: str) -> bool:
    """``jax-flatten_up_to`` only exists for the repeated-structure operation, the floor only
    for unflatten."""
    if contender == "floor":
        return op == "unflatten"
    return contender != "jax-flatten_up_to" or op == "repeated_flatten"


def make_call(contender: str, op: str, tree: Any, mod: Any = None) -> BoundCall:
    """The bound call that benchmarks ``op`` on ``tree`` for ``contender``."""
    if not applies(contender, op):
        raise ValueError(f"{contender} has no {op} benchmark")
    if op not in OPS:
        raise ValueError(f"unknown operation {op!r}")
    mod = module_for(contender) if mod is None else mod
    kw = _OPTREE_KW if contender == "optree" else {}

    if op == "flatten":
        return BoundCall(mod.tree_flatten, (tree,), kw)
    if contender == "floor":
        leaves, treedef = module_for("treeclone").tree_flatten(tree)
        return BoundCall(mod.unflatten_floor, (treedef, leaves))
    if op == "unflatten":
        leaves, treedef = mod.tree_flatten(tree, **kw)
        return BoundCall(mod.tree_unflatten, (treedef, leaves))
    if op == "tree_map":
        return BoundCall(mod.tree_map, (identity, tree), kw)
    # repeated_flatten
    if contender in ("treeclone", "jax-flatten_up_to"):
        treedef = mod.tree_structure(tree)
        return BoundCall(treedef.flatten_up_to, (tree,))
    return BoundCall(mod.tree_flatten, (tree,), kw)


def _same_objects(got: list, want: list) -> bool:
    return len(got) == len(want) and all(g is w for g, w in zip(got, want, strict=True))


def check_agreement(tree: Any, tc: Any = None) -> None:
    """Assert that treeclone returns exactly what jax returns for ``tree``.

    Leaves must be the very same objects, in the same order, and rebuilt trees must have
    equal jax structures. Raises AssertionError naming the first disagreement.
    """
    import jax.tree_util as jtu

    tc = module_for("treeclone") if tc is None else tc
    want_leaves, want_def = jtu.tree_flatten(tree)

    leaves, treedef = tc.tree_flatten(tree)
    assert _same_objects(leaves, want_leaves), "tree_flatten leaves differ from jax's"
    assert _same_objects(tc.tree_leaves(tree), want_leaves), "tree_leaves differ from jax's"
    up_to = tc.tree_structure(tree).flatten_up_to(tree)
    assert _same_objects(list(up_to), want_leaves), "treedef.flatten_up_to differs from jax's"
    # A second flatten of the same tree may take the cached dict-key-order path.
    assert _same_objects(tc.tree_flatten(tree)[0], want_leaves), "second tree_flatten differs"

    rebuilt = tc.tree_unflatten(treedef, leaves)
    want_rebuilt = jtu.tree_unflatten(want_def, want_leaves)
    assert jtu.tree_structure(rebuilt) == jtu.tree_structure(want_rebuilt), (
        "tree_unflatten builds a different structure from jax's"
    )
    assert _same_objects(jtu.tree_leaves(rebuilt), want_leaves), "tree_unflatten leaves differ"
    # The floor must create the same objects, or its time would not be a floor.
    floor = module_for("floor").unflatten_floor(treedef, leaves)
    assert jtu.tree_structure(floor) == jtu.tree_structure(want_rebuilt), (
        "the unflatten floor builds a different structure from jax's"
    )
    assert _same_objects(jtu.tree_leaves(floor), want_leaves), "the unflatten floor's leaves differ"

    mapped = tc.tree_map(identity, tree)
    assert jtu.tree_structure(mapped) == want_def, "tree_map builds a different structure"
    assert _same_objects(jtu.tree_leaves(mapped), want_leaves), "tree_map leaves differ"
