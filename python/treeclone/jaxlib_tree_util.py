"""``treeclone.tree_util`` for code that needs jaxlib's own treedefs.

``treeclone.tree_util`` returns treeclone's treedefs: they equal jaxlib's treedef of the same
structure, every treeclone function accepts either kind, and they are what makes its flatten
fast. But they are not instances of ``jax.tree_util.PyTreeDef``, and libraries check that at
run time (equinox, through jaxtyping's ``PyTreeDef`` annotations; ``isinstance`` checks). A
jaxlib treedef can only be made by jaxlib's flatten (converting one costs more than that
flatten), so this namespace is the drop-in for such code: the functions whose results hold a
treedef are ``jax.tree_util``'s own (exact jaxlib treedefs, at jaxlib's speed), and every other
function is treeclone's (its speed; they all accept jaxlib treedefs).

>>> import jax.tree_util as jtu
>>> import treeclone.jaxlib_tree_util as tu
>>> leaves, treedef = tu.tree_flatten({"b": (1, 2), "a": [3]})
>>> isinstance(treedef, jtu.PyTreeDef), leaves
(True, [3, 1, 2])
>>> tu.tree_unflatten(treedef, [30, 10, 20])
{'a': [30], 'b': (10, 20)}
"""

from __future__ import annotations

# Functions whose results hold a treedef, and the treedef type itself: jaxlib's.
from jax.tree_util import (  # noqa: F401  (re-exported through __all__)
    PyTreeDef,
    tree_flatten,
    tree_flatten_with_path,
    tree_structure,
    tree_transpose,
    treedef_children,
    treedef_tuple,
)

# Everything else: treeclone's.
from treeclone.tree_util import (  # noqa: F401  (re-exported through __all__)
    DictKey,
    FlattenedIndexKey,
    GetAttrKey,
    KeyEntry,
    KeyPath,
    Partial,
    SequenceKey,
    all_leaves,
    default_registry,
    keystr,
    register_dataclass,
    register_pytree_node,
    register_pytree_node_class,
    register_pytree_with_keys,
    register_pytree_with_keys_class,
    register_static,
    tree_all,
    tree_broadcast,
    tree_leaves,
    tree_leaves_with_path,
    tree_map,
    tree_map_with_path,
    tree_reduce,
    tree_reduce_associative,
    tree_unflatten,
    treedef_is_leaf,
)
from treeclone.tree_util import __all__ as _names

# JAX difference: jax.tree_util exports these registry queries from 0.10 on only; they are here
# exactly when treeclone.tree_util has them (that is, when the installed JAX does).
if "is_tree_node" in _names:
    from treeclone.tree_util import (  # noqa: F401  (re-exported through __all__)
        flatten_one_level,
        flatten_one_level_with_keys,
        is_tree_node,
    )

# The same names as treeclone.tree_util (the installed jax.tree_util's public names).
__all__ = list(_names)
