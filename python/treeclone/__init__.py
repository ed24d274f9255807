"""treeclone: a Rust pytree layer for JAX and a drop-in ``jit`` with explicit policies.

``treeclone.tree_util`` is a drop-in for ``jax.tree_util`` with the same semantics (JAX's
registry is the single source of truth), implemented in Rust. ``treeclone.jit`` is a drop-in
for ``jax.jit`` whose ``policy`` says what a call does with in-place mutations of its inputs
and with object identity: ``"clone"`` (what ``jax.jit`` does), ``"alias"`` (what plain Python
does) or ``"strict"`` (mutating an input without returning it is an error). ``treeclone.grad``,
``value_and_grad`` and ``checkpoint`` (``remat``) take the same policies, and so do ``vmap``,
``shard_map``, the loops ``scan``, ``fori_loop`` and ``while_loop`` (:mod:`treeclone.loops`),
and ``cond`` and ``switch``; each lives in the package named for it (``shard_map``,
``checkpoint`` and ``call`` in a module), jit and jit_partial in the package ``_jit``. See
``docs/semantics.md``.

>>> import jax.numpy as jnp, treeclone
>>> treeclone.tree_util.tree_leaves({"b": (1, 2), "a": [3]})
[3, 1, 2]
>>> @treeclone.jit(policy="alias")
... def accumulate(state, x):
...     state["total"] = state["total"] + x
>>> state = {"total": jnp.zeros(())}
>>> accumulate(state, 2.0)
>>> state
{'total': Array(2., dtype=float32)}
"""

from treeclone import tree, tree_util
from treeclone._jax_compat import UnsupportedJaxError
from treeclone._jit import JitPartial, Jitted, jit, jit_partial
from treeclone._native import PyTreeDef, SharedTreeDef, __version__
from treeclone._retrace import RetraceWarning
from treeclone.call import call
from treeclone.checkpoint import checkpoint, remat
from treeclone.cond import cond, switch
from treeclone.grad import grad, value_and_grad
from treeclone.loops import fori_loop, scan, while_loop
from treeclone.policies import (
    ALIAS,
    CLONE,
    STRICT,
    MutationError,
    MutationWarning,
    Policy,
    discarded_mutations,
    policy,
    register_inplace,
    set_discarded_mutations,
)
from treeclone.shard_map import shard_map
from treeclone.vmap import vmap

__all__: list[str] = [
    "ALIAS",
    "CLONE",
    "STRICT",
    "JitPartial",
    "Jitted",
    "MutationError",
    "MutationWarning",
    "Policy",
    "PyTreeDef",
    "RetraceWarning",
    "SharedTreeDef",
    "UnsupportedJaxError",
    "__version__",
    "call",
    "checkpoint",
    "cond",
    "discarded_mutations",
    "fori_loop",
    "grad",
    "jit",
    "jit_partial",
    "policy",
    "register_inplace",
    "remat",
    "scan",
    "set_discarded_mutations",
    "shard_map",
    "switch",
    "tree",
    "tree_util",
    "value_and_grad",
    "vmap",
    "while_loop",
]
