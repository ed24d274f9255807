"""The pytrees every treeclone benchmark runs on.

Shared by ``test_tree_bench.py`` (pytest-benchmark) and ``tree_table.py`` (the table in
``docs/benchmarks.md``), so both always measure the same shapes. Leaves are small numpy
float32 arrays: pytree operations never look inside a leaf, so only the structure matters.
Every builder is deterministic and returns a fresh tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np


def _leaf(*shape: int) -> np.ndarray:
    return np.zeros(shape or (1,), dtype=np.float32)


def _dense(n_in: int, n_out: int) -> dict[str, np.ndarray]:
    return {"w": _leaf(n_in, n_out), "b": _leaf(n_out)}


def _layer_norm(d: int) -> dict[str, np.ndarray]:
    return {"scale": _leaf(d), "bias": _leaf(d)}


def mlp_params(n_layers: int = 4, width: int = 8) -> dict[str, Any]:
    """A small MLP: ``{'layer0': {'w', 'b'}, ...}`` -- 2 * n_layers leaves (8 by default)."""
    return {f"layer{i}": _dense(width, width) for i in range(n_layers)}


def transformer_params(n_layers: int = 12, d: int = 4) -> dict[str, Any]:
    """A transformer-shaped parameter tree: 16 leaves per layer + 4, so 196 for 12 layers.

    ``{'embed': {...}, 'layers': [layer, ...], 'final_ln': {...}}`` where each layer holds
    attention q/k/v/o (w and b), two layer norms and a two-matrix MLP.
    """
    layers = [
        {
            "attention": {name: _dense(d, d) for name in ("q", "k", "v", "o")},
            "ln1": _layer_norm(d),
            "mlp": {
                "w1": _leaf(d, 4 * d),
                "b1": _leaf(4 * d),
                "w2": _leaf(4 * d, d),
                "b2": _leaf(d),
            },
            "ln2": _layer_norm(d),
        }
        for _ in range(n_layers)
    ]
    return {
        "embed": {"token": _leaf(16, d), "position": _leaf(8, d)},
        "layers": layers,
        "final_ln": _layer_norm(d),
    }


class AdamState(NamedTuple):
    """Shaped like optax's ``ScaleByAdamState``: a step count and two moment trees."""

    count: np.ndarray
    mu: Any
    nu: Any


class EmptyState(NamedTuple):
    """Shaped like optax's ``EmptyState``: a node with no children."""


def transformer_adam(n_layers: int = 12, d: int = 4) -> dict[str, Any]:
    """Parameters plus Adam optimizer state, as an optax training step carries them.

    ``{'params': P, 'opt_state': (AdamState(count, mu=P', nu=P''), EmptyState())}``:
    3 * 196 + 1 = 589 leaves for 12 layers; mixes dicts, lists, tuples and namedtuples.
    """
    state = AdamState(
        count=np.zeros((), dtype=np.int32),
        mu=transformer_params(n_layers, d),
        nu=transformer_params(n_layers, d),
    )
    return {"params": transformer_params(n_layers, d), "opt_state": (state, EmptyState())}


def flat_dict(n: int = 10_000) -> dict[str, np.ndarray]:
    """``{'k0': leaf, 'k1': leaf, ...}`` inserted in numeric order.

    Sorted order ('k0', 'k1', 'k10', 'k100', ...) differs from insertion order, so every
    flatten has to produce the sorted key order, as JAX does.
    """
    return {f"k{i}": _leaf() for i in range(n)}


def nested_list(depth: int = 500) -> list[Any]:
    """``[leaf, [leaf, [... [leaf]]]]``: ``depth`` nested lists, ``depth`` leaves."""
    tree: list[Any] = [_leaf()]
    for _ in range(depth - 1):
        tree = [_leaf(), tree]
    return tree


TREES: dict[str, Callable[[], Any]] = {
    "mlp": mlp_params,
    "transformer": transformer_params,
    "transformer_adam": transformer_adam,
    "flat_dict_10k": flat_dict,
    "nested_list_500": nested_list,
}
