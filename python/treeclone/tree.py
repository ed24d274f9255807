"""A drop-in for the ``jax.tree`` namespace, built on :mod:`treeclone.tree_util`.

Each function has the signature of its ``jax.tree`` namesake and the semantics of the
``jax.tree_util`` function it stands for (``treeclone.tree.map`` is
``treeclone.tree_util.tree_map``, and so on): the same leaves, structures, key paths and errors
as JAX, computed by treeclone's Rust core. The module has exactly the names of the installed
``jax.tree``.

>>> import treeclone
>>> treeclone.tree.map(lambda x: x * 10, {"b": [1, 2], "a": (3,)})
{'a': (30,), 'b': [10, 20]}
"""

from __future__ import annotations

import dataclasses as _dataclasses
import typing as _typing

import jax.tree as _jax_tree

from treeclone import _jax_compat
from treeclone import tree_util as _tree_util

if _typing.TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeVar

    from treeclone import tree_util

    T = TypeVar("T")


def all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether every leaf of ``tree`` is truthy (``all()`` over the leaves).

    >>> import treeclone
    >>> treeclone.tree.all([True, {"a": True, "b": (True, True)}])
    True
    >>> treeclone.tree.all([False, (True, False)])
    False
    """
    return _tree_util.tree_all(tree, is_leaf=is_leaf)


def flatten(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> tuple[list[tree_util.Leaf], tree_util.PyTreeDef]:
    """The leaves of ``tree`` (depth first, left to right) and its structure.

    >>> import treeclone
    >>> leaves, treedef = treeclone.tree.flatten([1, (2, 3), [4, 5]])
    >>> leaves
    [1, 2, 3, 4, 5]
    >>> treedef
    PyTreeDef([*, (*, *), [*, *]])
    """
    return _tree_util.tree_flatten(tree, is_leaf)


def leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[tree_util.Leaf]:
    """The leaves of ``tree``, depth first, left to right.

    >>> import treeclone
    >>> treeclone.tree.leaves([1, (2, 3), {"b": 5, "a": 4}])
    [1, 2, 3, 4, 5]
    """
    return _tree_util.tree_leaves(tree, is_leaf)


def map(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """``tree``'s structure with ``f(leaf, *matching_subtrees_of_rest)`` at each leaf.

    Each tree of ``rest`` has ``tree``'s structure, or ``tree``'s structure as a prefix.

    >>> import treeclone
    >>> treeclone.tree.map(lambda x: x + 1, {"x": 7, "y": 42})
    {'x': 8, 'y': 43}
    >>> treeclone.tree.map(lambda x, y: [x] + y, [5, 6], [[7, 9], [1, 2]])
    [[5, 7, 9], [6, 1, 2]]
    """
    return _tree_util.tree_map(f, tree, *rest, is_leaf=is_leaf)


def reduce(
    function: Callable[[T, Any], T],
    tree: Any,
    initializer: T | tree_util.Unspecified = _jax_compat.UNSPECIFIED,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """``functools.reduce(function, leaves[, initializer])`` over the leaves of ``tree``.

    >>> import operator
    >>> import treeclone
    >>> treeclone.tree.reduce(operator.add, [1, (2, 3), [4, 5, 6]])
    21
    >>> treeclone.tree.reduce(operator.add, {"a": None}, 0)
    0
    """
    return _tree_util.tree_reduce(function, tree, initializer, is_leaf=is_leaf)


def reduce_associative(
    operation: Callable[[T, T], T],
    tree: Any,
    *,
    identity: T | tree_util.Unspecified = _jax_compat.UNSPECIFIED,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """Reduce the leaves of ``tree`` with an associative ``operation`` (a balanced tree of calls).

    ``identity`` is the result for a tree without leaves (which is an error without it).

    >>> import operator
    >>> import treeclone
    >>> treeclone.tree.reduce_associative(operator.add, [1, (2, 3), [4, 5, 6]])
    21
    >>> treeclone.tree.reduce_associative(operator.mul, [], identity=1)
    1
    """
    return _tree_util.tree_reduce_associative(operation, tree, identity=identity, is_leaf=is_leaf)


def structure(tree: Any, is_leaf: None | Callable[[Any], bool] = None) -> tree_util.PyTreeDef:
    """The structure (treedef) of ``tree``.

    >>> import treeclone
    >>> treeclone.tree.structure([1, (2, 3), {"a": None}])
    PyTreeDef([*, (*, *), {'a': None}])
    """
    return _tree_util.tree_structure(tree, is_leaf)


def transpose(
    outer_treedef: tree_util.PyTreeDef,
    inner_treedef: tree_util.PyTreeDef | None,
    pytree_to_transpose: Any,
) -> Any:
    """Turn a tree of structure (outer, inner) into one of structure (inner, outer).

    ``inner_treedef=None`` infers the inner structure from the first outer leaf.

    >>> import treeclone
    >>> tree = [(1, 2, 3), (4, 5, 6)]
    >>> outer = treeclone.tree.structure(["*", "*"])
    >>> inner = treeclone.tree.structure(("*", "*", "*"))
    >>> treeclone.tree.transpose(outer, inner, tree)
    ([1, 4], [2, 5], [3, 6])
    >>> treeclone.tree.transpose(outer, None, tree)
    ([1, 4], [2, 5], [3, 6])
    """
    return _tree_util.tree_transpose(outer_treedef, inner_treedef, pytree_to_transpose)


def unflatten(treedef: tree_util.PyTreeDef, leaves: Iterable[tree_util.Leaf]) -> Any:
    """The tree of structure ``treedef`` whose leaves are ``leaves`` (the inverse of flatten).

    >>> import treeclone
    >>> _, treedef = treeclone.tree.flatten([1, (2, 3), [4, 5]])
    >>> treeclone.tree.unflatten(treedef, [100, 200, 300, 400, 500])
    [100, (200, 300), [400, 500]]
    """
    return _tree_util.tree_unflatten(treedef, leaves)


def flatten_with_path(
    tree: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> tuple[list[tuple[tree_util.KeyPath, Any]], tree_util.PyTreeDef]:
    """Like :func:`flatten`, each leaf paired with its key path.

    With ``is_leaf_takes_path=True``, ``is_leaf`` is called as ``is_leaf(key_path, x)``.

    >>> import treeclone
    >>> pairs, treedef = treeclone.tree.flatten_with_path([1, {"x": 3}])
    >>> pairs
    [((SequenceKey(idx=0),), 1), ((SequenceKey(idx=1), DictKey(key='x')), 3)]
    >>> treedef
    PyTreeDef([*, {'x': *}])
    """
    return _tree_util.tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)


def leaves_with_path(
    tree: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> list[tuple[tree_util.KeyPath, Any]]:
    """The ``(key_path, leaf)`` pairs of ``tree``.

    >>> import treeclone
    >>> treeclone.tree.leaves_with_path([1, {"x": 3}])
    [((SequenceKey(idx=0),), 1), ((SequenceKey(idx=1), DictKey(key='x')), 3)]
    """
    return _tree_util.tree_leaves_with_path(tree, is_leaf, is_leaf_takes_path)


def map_with_path(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> Any:
    """Like :func:`map`, with ``f(key_path, leaf, *matching_subtrees_of_rest)``.

    >>> import treeclone
    >>> treeclone.tree.map_with_path(lambda path, x: x + path[0].idx, [1, 2, 3])
    [1, 3, 5]
    >>> treeclone.tree.map_with_path(
    ...     lambda path, x: treeclone.tree_util.keystr(path), {"a": [0, 0]}
    ... )
    {'a': ["['a'][0]", "['a'][1]"]}
    """
    return _tree_util.tree_map_with_path(
        f, tree, *rest, is_leaf=is_leaf, is_leaf_takes_path=is_leaf_takes_path
    )


def broadcast(
    prefix_tree: Any, full_tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> Any:
    """``full_tree``'s structure, each leaf being the leaf of ``prefix_tree`` above it.

    >>> import treeclone
    >>> treeclone.tree.broadcast((1, 2, 3), (0, {"a": 0, "b": 0}, (0, 0)))
    (1, {'a': 2, 'b': 2}, (3, 3))
    >>> treeclone.tree.broadcast({"w": 0.5, "b": None}, {"w": [1, 2], "b": None})
    {'b': None, 'w': [0.5, 0.5]}
    """
    return _tree_util.tree_broadcast(prefix_tree, full_tree, is_leaf=is_leaf)


# Type checkers treat a function that returns dataclasses.field specially only when it is
# dataclasses.field (PEP 681), hence the alias for them, as in JAX.
if _typing.TYPE_CHECKING:
    static = _dataclasses.field
else:

    def static(**kwargs):
        """``dataclasses.field(**kwargs)`` marked static for ``register_dataclass``.

        >>> import dataclasses
        >>> import treeclone
        >>> @treeclone.tree_util.register_dataclass
        ... @dataclasses.dataclass
        ... class Scaled:
        ...     x: float
        ...     op: str = treeclone.tree.static(default="mul")
        >>> leaves, treedef = treeclone.tree.flatten(Scaled(2.0))
        >>> leaves
        [2.0]
        >>> treedef
        PyTreeDef(CustomNode(Scaled[('mul',)], [*]))
        """
        metadata = {"static": True, **(kwargs.pop("metadata", {}) or {})}
        return _dataclasses.field(metadata=metadata, **kwargs)


def _keep_jax_names() -> None:
    # Exactly the public names of the installed jax.tree: an older JAX lacks some functions.
    namespace = globals()
    for name in [name for name in namespace if not name.startswith("_")]:
        if not hasattr(_jax_tree, name):
            del namespace[name]


_keep_jax_names()
