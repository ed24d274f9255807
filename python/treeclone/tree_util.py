"""A drop-in for ``jax.tree_util``, backed by treeclone's Rust core.

Every function has the signature and the semantics of its ``jax.tree_util`` namesake: the same
leaves (the very same objects, in the same order), the same structure, the same key paths (JAX's
own key classes) and the same errors. Node types come from JAX's registry, so a type registered
through ``jax.tree_util`` (before or after this import) or through this module is a node to both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import jax.tree_util as _jtu

from treeclone import _jax_compat, _native
from treeclone._jax_compat import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey, keystr
from treeclone._native import PyTreeDef

_native.check_jax()

tree_flatten = _native.flatten
tree_leaves = _native.leaves
tree_structure = _native.structure
tree_map = _native.tree_map


def tree_unflatten(treedef: PyTreeDef, leaves: Iterable[Any]) -> Any:
    """Rebuild the tree of ``treedef`` from ``leaves``."""
    return _as_treedef(treedef).unflatten(leaves)


def tree_flatten_with_path(
    tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
) -> tuple[list[tuple[tuple, Any]], PyTreeDef]:
    """``([(key_path, leaf), ...], treedef)``."""
    return _native.flatten_with_path(tree, is_leaf, is_leaf_takes_path)


def tree_leaves_with_path(
    tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
) -> list[tuple[tuple, Any]]:
    """``[(key_path, leaf), ...]``."""
    return _native.flatten_with_path(tree, is_leaf, is_leaf_takes_path)[0]


def tree_map_with_path(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> Any:
    """``f(key_path, leaf, *matching_subtrees_of_rest)`` over the leaves of ``tree``."""
    pairs, treedef = _native.flatten_with_path(tree, is_leaf, is_leaf_takes_path)
    others = []
    for other in rest:
        try:
            others.append(treedef.flatten_up_to(other))
        except Exception as exc:
            raise _jax_compat.prefix_error(
                tree, other, is_leaf, exc, "tree_map_with_path tree"
            ) from None
    return treedef.unflatten(
        [f(path, leaf, *(o[i] for o in others)) for i, (path, leaf) in enumerate(pairs)]
    )


class _Missing:
    pass


_MISSING = _Missing()


def tree_reduce(
    function: Callable[[Any, Any], Any],
    tree: Any,
    initializer: Any = _MISSING,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """``functools.reduce`` over the leaves of ``tree``."""
    leaves = _native.leaves(tree, is_leaf)
    if initializer is _MISSING:
        return functools.reduce(function, leaves)
    return functools.reduce(function, leaves, initializer)


def tree_all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether every leaf of ``tree`` is truthy."""
    return all(_native.leaves(tree, is_leaf))


def all_leaves(iterable: Iterable[Any], is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether every element of ``iterable`` is a leaf."""
    if is_leaf is None:
        return all(_native.is_leaf_object(x) for x in iterable)
    items = list(iterable)
    leaves = _native.leaves(items, is_leaf)
    return len(leaves) == len(items) and all(a is b for a, b in zip(items, leaves, strict=True))


def tree_transpose(outer_treedef: Any, inner_treedef: Any, pytree_to_transpose: Any) -> Any:
    """Turn a tree of trees (outer of inner) into a tree of trees (inner of outer)."""
    outer_treedef = _as_treedef(outer_treedef)
    flat, treedef = _native.flatten(pytree_to_transpose)
    if inner_treedef is None:
        inner_treedef = _native.structure(outer_treedef.flatten_up_to(pytree_to_transpose)[0])
    inner_treedef = _as_treedef(inner_treedef)
    inner_size = inner_treedef.num_leaves
    outer_size = outer_treedef.num_leaves
    if treedef.num_leaves != inner_size * outer_size:
        expected = outer_treedef.compose(inner_treedef)
        raise TypeError(f"Mismatch\n{treedef}\n != \n{expected}")
    rows = [flat[i * inner_size : (i + 1) * inner_size] for i in range(outer_size)]
    subtrees = [outer_treedef.unflatten(column) for column in zip(*rows, strict=True)]
    return inner_treedef.unflatten(subtrees)


def treedef_children(treedef: PyTreeDef) -> list[PyTreeDef]:
    """The treedefs of the root's children."""
    return _as_treedef(treedef).children()


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
    """Whether ``treedef`` is a single leaf or an empty node (no children)."""
    return _as_treedef(treedef).num_nodes == 1


def treedef_is_strict_leaf(treedef: PyTreeDef) -> bool:
    """Whether ``treedef`` is a single leaf."""
    treedef = _as_treedef(treedef)
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def treedef_tuple(treedefs: Iterable[PyTreeDef]) -> PyTreeDef:
    """The treedef of a tuple whose children have the given treedefs."""
    return _native.treedef_tuple([_as_treedef(t) for t in treedefs])


def _as_treedef(treedef: Any) -> PyTreeDef:
    if isinstance(treedef, PyTreeDef):
        return treedef
    if isinstance(treedef, _jtu.PyTreeDef):
        return PyTreeDef.from_jax(treedef)
    raise TypeError(f"expected a PyTreeDef, got {type(treedef).__name__}")


def _registers(jax_function):
    """Wrap a JAX registration function so that treeclone sees the new type at once."""

    @functools.wraps(jax_function)
    def register(*args, **kwargs):
        try:
            return jax_function(*args, **kwargs)
        finally:
            _native.invalidate_registry_cache()

    return register


register_pytree_node = _registers(_jtu.register_pytree_node)
register_pytree_with_keys = _registers(_jtu.register_pytree_with_keys)
register_pytree_node_class = _registers(_jtu.register_pytree_node_class)
register_pytree_with_keys_class = _registers(_jtu.register_pytree_with_keys_class)
register_dataclass = _registers(_jtu.register_dataclass)
register_static = _registers(_jtu.register_static)

__all__ = [
    "DictKey",
    "FlattenedIndexKey",
    "GetAttrKey",
    "PyTreeDef",
    "SequenceKey",
    "all_leaves",
    "keystr",
    "register_dataclass",
    "register_pytree_node",
    "register_pytree_node_class",
    "register_pytree_with_keys",
    "register_pytree_with_keys_class",
    "register_static",
    "tree_all",
    "tree_flatten",
    "tree_flatten_with_path",
    "tree_leaves",
    "tree_leaves_with_path",
    "tree_map",
    "tree_map_with_path",
    "tree_reduce",
    "tree_structure",
    "tree_transpose",
    "tree_unflatten",
    "treedef_children",
    "treedef_is_leaf",
    "treedef_is_strict_leaf",
    "treedef_tuple",
]
