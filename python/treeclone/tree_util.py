"""A drop-in for ``jax.tree_util``, backed by treeclone's Rust core.

Every function has the signature and the semantics of its ``jax.tree_util`` namesake: the same
leaves (the very same objects, in the same order), the same structure, the same key paths (JAX's
own key classes) and the same errors. Node types come from JAX's registry, so a type registered
through ``jax.tree_util`` (before or after this import) or through this module is a node to both.

The module's public names are exactly those of the installed ``jax.tree_util``. Everything that
walks a tree runs on the Rust core; JAX's own objects are re-exported where they are JAX's types
or registry queries: the key classes, ``KeyEntry``, ``KeyPath``, ``Partial``,
``default_registry``, ``is_tree_node``, ``flatten_one_level`` and
``flatten_one_level_with_keys`` (one node, looked up in JAX's registry: the children come back
as the very container the node's flatten function made, which only the registry has).

>>> import treeclone.tree_util as tu
>>> leaves, treedef = tu.tree_flatten({"b": [1, 2], "a": None})
>>> leaves, treedef
([1, 2], PyTreeDef({'a': None, 'b': [*, *]}))
>>> tu.tree_unflatten(treedef, ["x", "y"])
{'a': None, 'b': ['x', 'y']}
"""

from __future__ import annotations

import functools as _functools
import typing as _typing

import jax.tree_util as _jtu

# JAX's types and registry object, re-exported ("X as X": explicitly public).
from jax.tree_util import KeyEntry as KeyEntry
from jax.tree_util import KeyPath as KeyPath
from jax.tree_util import Partial as Partial
from jax.tree_util import default_registry as default_registry

from treeclone import _jax_compat, _native
from treeclone._jax_compat import DictKey as DictKey
from treeclone._jax_compat import FlattenedIndexKey as FlattenedIndexKey
from treeclone._jax_compat import GetAttrKey as GetAttrKey
from treeclone._jax_compat import SequenceKey as SequenceKey
from treeclone._jax_compat import keystr as keystr
from treeclone._native import PyTreeDef

if _typing.TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeVar

    from jax._src.tree_util import Leaf as Leaf
    from jax._src.tree_util import Unspecified
    from jax.tree_util import flatten_one_level as flatten_one_level
    from jax.tree_util import flatten_one_level_with_keys as flatten_one_level_with_keys
    from jax.tree_util import is_tree_node as is_tree_node

    T = TypeVar("T")
else:
    # Registry queries, JAX's own functions; releases that do not export them lack them here too.
    flatten_one_level = getattr(_jtu, "flatten_one_level", None)
    flatten_one_level_with_keys = getattr(_jtu, "flatten_one_level_with_keys", None)
    is_tree_node = getattr(_jtu, "is_tree_node", None)

_native.check_jax()

tree_flatten = _native.flatten
tree_leaves = _native.leaves
tree_structure = _native.structure
tree_map = _native.tree_map


# Native, so that a call costs no Python frame (a jaxlib treedef unflattens itself, as in JAX).
tree_unflatten = _native.tree_unflatten


def tree_flatten_with_path(
    tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
) -> tuple[list[tuple[KeyPath, Any]], PyTreeDef]:
    """``([(key_path, leaf), ...], treedef)``.

    >>> import treeclone.tree_util as tu
    >>> pairs, treedef = tu.tree_flatten_with_path({"a": [1, 2]})
    >>> [(tu.keystr(path), leaf) for path, leaf in pairs]
    [("['a'][0]", 1), ("['a'][1]", 2)]
    """
    return _native.flatten_with_path(tree, is_leaf, is_leaf_takes_path)


def tree_leaves_with_path(
    tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
) -> list[tuple[KeyPath, Any]]:
    """``[(key_path, leaf), ...]``.

    >>> import treeclone.tree_util as tu
    >>> [(tu.keystr(path), leaf) for path, leaf in tu.tree_leaves_with_path((1, {"x": 2}))]
    [('[0]', 1), ("[1]['x']", 2)]
    """
    return _native.flatten_with_path(tree, is_leaf, is_leaf_takes_path)[0]


def tree_map_with_path(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> Any:
    """``f(key_path, leaf, *matching_subtrees_of_rest)`` over the leaves of ``tree``.

    >>> import treeclone.tree_util as tu
    >>> tu.tree_map_with_path(lambda path, x: f"{tu.keystr(path)}={x}", {"a": [1, 2]})
    {'a': ["['a'][0]=1", "['a'][1]=2"]}
    """
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


def tree_reduce(
    function: Callable[[T, Any], T],
    tree: Any,
    initializer: T | Unspecified = _jax_compat.UNSPECIFIED,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """``functools.reduce`` over the leaves of ``tree``.

    >>> import operator
    >>> import treeclone.tree_util as tu
    >>> tu.tree_reduce(operator.add, [1, (2, 3), {"a": 4}])
    10
    >>> tu.tree_reduce(operator.add, [], 100)
    100
    """
    leaves = _native.leaves(tree, is_leaf)
    if _jax_compat.is_unspecified(initializer):
        return _functools.reduce(function, leaves)
    return _functools.reduce(function, leaves, _typing.cast("T", initializer))


def tree_reduce_associative(
    operation: Callable[[T, T], T],
    tree: Any,
    *,
    identity: T | Unspecified = _jax_compat.UNSPECIFIED,
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
    """Reduce the leaves of ``tree`` with an associative ``operation``, as a balanced tree of calls.

    ``identity`` is the result for a tree without leaves (which is an error without it).

    >>> import operator
    >>> import treeclone.tree_util as tu
    >>> tu.tree_reduce_associative(operator.add, [1, (2, 3), [4, 5, 6]])
    21
    >>> tu.tree_reduce_associative(lambda a, b: f"({a}+{b})", ["a", "b", "c", "d"])
    '((a+b)+(c+d))'
    >>> tu.tree_reduce_associative(operator.add, [None, ()], identity=0)
    0
    """
    return _parallel_reduce(_native.leaves(tree, is_leaf), operation, identity)


def _parallel_reduce(
    sequence: list[Any], operation: Callable[[Any, Any], Any], identity: Any
) -> Any:
    # JAX's order of calls: split in halves, the left half first.
    length = len(sequence)
    if length == 0:
        if _jax_compat.is_unspecified(identity):
            raise TypeError("Must specify identity for parallel reduction of empty sequence.")
        return identity
    if length == 1:
        return sequence[0]
    index = length // 2
    left = _parallel_reduce(sequence[:index], operation, identity)
    right = _parallel_reduce(sequence[index:], operation, identity)
    return operation(left, right)


def tree_all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether every leaf of ``tree`` is truthy.

    >>> import treeclone.tree_util as tu
    >>> tu.tree_all({"a": 1, "b": (True, [2.0])}), tu.tree_all([1, 0])
    (True, False)
    """
    return all(_native.leaves(tree, is_leaf))


def all_leaves(iterable: Iterable[Any], is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether every element of ``iterable`` is a leaf.

    >>> import treeclone.tree_util as tu
    >>> tu.all_leaves([1, "a", 2.0]), tu.all_leaves([1, [2]])
    (True, False)
    """
    if is_leaf is None:
        return all(_native.is_leaf_object(x) for x in iterable)
    items = list(iterable)
    leaves = _native.leaves(items, is_leaf)
    return len(leaves) == len(items) and all(a is b for a, b in zip(items, leaves, strict=True))


def tree_transpose(
    outer_treedef: PyTreeDef, inner_treedef: PyTreeDef | None, pytree_to_transpose: Any
) -> Any:
    """Turn a tree of trees (outer of inner) into a tree of trees (inner of outer).

    >>> import treeclone.tree_util as tu
    >>> outer, inner = tu.tree_structure([0, 0]), tu.tree_structure((0, 0))
    >>> tu.tree_transpose(outer, inner, [(1, 2), (3, 4)])
    ([1, 3], [2, 4])
    """
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


def tree_broadcast(
    prefix_tree: Any, full_tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> Any:
    """``full_tree``'s structure, each leaf being the leaf of ``prefix_tree`` above it.

    ``prefix_tree`` must be a prefix of ``full_tree``: each of its leaves stands for a whole
    subtree of ``full_tree``, and is repeated for every leaf of that subtree.

    >>> import treeclone.tree_util as tu
    >>> tu.tree_broadcast((1, 2, 3), (0, {"a": 0, "b": 0}, (0, 0)))
    (1, {'a': 2, 'b': 2}, (3, 3))
    >>> tu.tree_broadcast([1, 2], ({"a": 0}, 0))
    Traceback (most recent call last):
    ...
    ValueError: pytree structure error: different types at key path
        broadcast_prefix prefix_tree
    At that key path, the prefix pytree broadcast_prefix prefix_tree has a subtree of type
        <class 'list'>
    but at the same key path the full pytree has a subtree of different type
        <class 'tuple'>.
    """
    result: list[Any] = []

    def add_leaves(x: Any, subtree: Any) -> None:
        result.extend([x] * _native.structure(subtree).num_leaves)

    # JAX's steps, on the Rust core: a tree_map over the prefix (whose mismatch errors are
    # replaced by the prefix errors of the whole trees), then the full tree's structure.
    try:
        _native.tree_map(add_leaves, prefix_tree, full_tree, is_leaf=is_leaf)
    except ValueError as exc:
        if str(exc).startswith("cycle detected in pytree"):
            raise  # JAX recurses on a cyclic tree until it fails: keep treeclone's clear error
        try:
            errors = _jax_compat.prefix_errors(prefix_tree, full_tree)
        except (RecursionError, SystemError):
            raise exc from None
        error, *_ = errors
        raise error("broadcast_prefix prefix_tree") from None
    return _native.structure(full_tree).unflatten(result)


def treedef_children(treedef: PyTreeDef) -> list[PyTreeDef]:
    """The treedefs of the root's children.

    >>> import treeclone.tree_util as tu
    >>> tu.treedef_children(tu.tree_structure(([1, 2], 3)))
    [PyTreeDef([*, *]), PyTreeDef(*)]
    """
    return treedef.children()  # of a jaxlib treedef: jaxlib treedefs, as in JAX


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
    """Whether ``treedef`` is a single leaf or an empty node (no children).

    >>> import treeclone.tree_util as tu
    >>> tu.treedef_is_leaf(tu.tree_structure(None)), tu.treedef_is_leaf(tu.tree_structure([1]))
    (True, False)
    """
    return treedef.num_nodes == 1


def treedef_is_strict_leaf(treedef: PyTreeDef) -> bool:
    """Whether ``treedef`` is a single leaf (internal to ``jax.tree_util``: not exported)."""
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def treedef_tuple(treedefs: Iterable[PyTreeDef]) -> PyTreeDef:
    """The treedef of a tuple whose children have the given treedefs (of either kind).

    >>> import treeclone.tree_util as tu
    >>> tu.treedef_tuple([tu.tree_structure([1, 2]), tu.tree_structure(3)])
    PyTreeDef(([*, *], *))
    """
    return _native.treedef_tuple(list(treedefs))  # jaxlib's are converted


def _as_treedef(treedef: Any) -> PyTreeDef:
    # A JAX treedef becomes treeclone's; anything else is used as it is, as JAX uses it, so that
    # a non-treedef fails as in JAX (e.g. "'list' object has no attribute 'unflatten'").
    if type(treedef) is PyTreeDef:  # the common case first: unflatten is on the hot path
        return treedef
    if isinstance(treedef, _jtu.PyTreeDef):
        return PyTreeDef.from_jax(treedef)
    return treedef


def _registers(jax_function: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a JAX registration function so that treeclone sees the new type at once."""

    @_functools.wraps(jax_function)
    def register(*args: Any, **kwargs: Any) -> Any:
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

# --------------------------------------------------------------------------------------------
# Public names: exactly those of the installed jax.tree_util.
# --------------------------------------------------------------------------------------------

# Everything this module can provide under a public name.
_PROVIDED = (
    "DictKey",
    "FlattenedIndexKey",
    "GetAttrKey",
    "KeyEntry",
    "KeyPath",
    "Partial",
    "PyTreeDef",
    "SequenceKey",
    "all_leaves",
    "default_registry",
    "flatten_one_level",
    "flatten_one_level_with_keys",
    "is_tree_node",
    "keystr",
    "register_dataclass",
    "register_pytree_node",
    "register_pytree_node_class",
    "register_pytree_with_keys",
    "register_pytree_with_keys_class",
    "register_static",
    "tree_all",
    "tree_broadcast",
    "tree_flatten",
    "tree_flatten_with_path",
    "tree_leaves",
    "tree_leaves_with_path",
    "tree_map",
    "tree_map_with_path",
    "tree_reduce",
    "tree_reduce_associative",
    "tree_structure",
    "tree_transpose",
    "tree_unflatten",
    "treedef_children",
    "treedef_is_leaf",
    "treedef_is_strict_leaf",
    "treedef_tuple",
)
_JAX_NAMES = frozenset(name for name in dir(_jtu) if not name.startswith("_"))
__all__ = [name for name in _PROVIDED if name in _JAX_NAMES]


def _unexported() -> dict[str, Any]:
    # The names that the installed jax.tree_util does not export leave the namespace:
    # treedef_is_strict_leaf (JAX keeps it internal) and, on an older JAX, the functions that it
    # does not have yet. Those that treeclone has stay reachable as attributes (__getattr__).
    namespace = globals()
    hidden = {}
    for name in _PROVIDED:
        if name not in _JAX_NAMES:
            value = namespace.pop(name)
            if value is not None:
                hidden[name] = value
    return hidden


_UNEXPORTED = _unexported()
del annotations


if not _typing.TYPE_CHECKING:  # hidden from type checkers: any other name is a typo to them

    def __getattr__(name: str) -> Any:
        try:
            return _UNEXPORTED[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
