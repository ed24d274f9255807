"""Everything treeclone reads from JAX's internals lives here, behind one version check.

JAX keeps the Python-side flatten/unflatten functions of every registered node type in
``jax._src.tree_util._registry`` (a dict that only grows). The Rust core classifies an unknown
type by calling :func:`classify_type` once and caches the answer; it notices registrations made
later, through any of JAX's public functions, because the size of that dict changes.
"""

from __future__ import annotations

import jax
import jax._src.tree_util as _jtu
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey, keystr

from treeclone._native import TypeKind

# Oldest JAX release whose internals this module has been checked against.
MIN_JAX = (0, 6, 0)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version_tuple(jax.__version__) < MIN_JAX:
    raise ImportError(
        f"treeclone needs jax>={'.'.join(map(str, MIN_JAX))}, found jax {jax.__version__}"
    )

try:
    registry: dict = _jtu._registry
    default_registry = _jtu.default_registry
    _from_node_data_and_children = type(jax.tree_util.tree_structure(0)).from_node_data_and_children
except AttributeError as exc:  # pragma: no cover - only on a JAX release that moved these
    raise ImportError(
        f"treeclone cannot read the pytree registry of jax {jax.__version__}: {exc}. "
        "Please report this with your JAX version."
    ) from exc

flatten_one_level_with_keys = default_registry.flatten_one_level_with_keys


def _opaque_functions(ty: type):
    """Flatten/unflatten for a type registered only in jaxlib's C++ registry."""

    def flatten(obj):
        return default_registry.flatten_one_level(obj)

    def unflatten(aux, children):
        children = tuple(children)
        leaf = jax.tree_util.tree_structure(0)
        treedef = _from_node_data_and_children(default_registry, (ty, aux), [leaf] * len(children))
        return treedef.unflatten(children)

    return flatten, unflatten


def classify_type(ty: type):
    """``(TypeKind, flatten, unflatten)`` for a type that is not list, tuple, dict or None."""
    entry = registry.get(ty)
    if entry is not None:
        return TypeKind.Custom, entry.to_iter, entry.from_iter
    if issubclass(ty, tuple) and hasattr(ty, "_fields"):
        return TypeKind.NamedTuple, None, None
    if default_registry.is_node(ty):
        return (TypeKind.Custom, *_opaque_functions(ty))
    return TypeKind.Leaf, None, None


def unflatten_node(ty: type, aux, children):
    """One node of a registered type ``ty`` built from its aux data and children."""
    entry = registry.get(ty)
    if entry is not None:
        return entry.from_iter(aux, children)
    return _opaque_functions(ty)[1](aux, children)


def to_jax_node(node_data, children):
    """Build one jaxlib PyTreeDef node from JAX-style node data and child treedefs."""
    return _from_node_data_and_children(default_registry, node_data, children)


__all__ = [
    "DictKey",
    "FlattenedIndexKey",
    "GetAttrKey",
    "SequenceKey",
    "UNSPECIFIED",
    "classify_type",
    "flatten_one_level_with_keys",
    "is_unspecified",
    "keystr",
    "prefix_errors",
    "registry",
    "to_jax_node",
    "unflatten_node",
]


def prefix_error(tree, other, is_leaf, exc, name):
    """The exception JAX's tree_map raises when `other` does not match `tree`'s structure."""
    try:
        err = next(_jtu._prefix_error((), tree, other, is_leaf), None)
    except (RecursionError, SystemError):
        return exc  # JAX's message builder recurses into a cyclic tree: keep treeclone's error
    return err(name) if err is not None else exc


def prefix_errors(prefix_tree, full_tree, is_leaf=None):
    """JAX's message builders for each place where ``prefix_tree`` is not a prefix of
    ``full_tree`` (``jax._src.tree_util.prefix_errors``): ``[fn(name) -> ValueError, ...]``."""
    return list(_jtu._prefix_error((), prefix_tree, full_tree, is_leaf))


# "No initializer" for tree_reduce (and "no identity" for tree_reduce_associative): an
# ``Unspecified()`` instance on recent JAX, the ``no_initializer`` object on JAX 0.6. A caller
# who passes JAX's own sentinel to treeclone gets what JAX would do with it.
_Unspecified = getattr(_jtu, "Unspecified", None)
UNSPECIFIED = _Unspecified() if _Unspecified is not None else _jtu.no_initializer


def is_unspecified(x) -> bool:
    """Whether ``x`` is JAX's "argument not given" sentinel of tree_reduce."""
    if _Unspecified is not None:
        return isinstance(x, _Unspecified)
    return x is UNSPECIFIED
