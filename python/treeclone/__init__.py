"""treeclone: a Rust pytree layer for JAX.

``treeclone.tree_util`` is a drop-in for ``jax.tree_util`` with the same semantics (JAX's
registry is the single source of truth), implemented in Rust.
"""

from treeclone import tree_util
from treeclone._native import PyTreeDef, __version__

__all__ = ["PyTreeDef", "__version__", "tree_util"]
