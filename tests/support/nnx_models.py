"""flax nnx models the tests share (the equinox ones: ``eqx_models.py``).

- ``Block``: an ``nnx.Linear`` then an ``nnx.BatchNorm``, whose running statistics a step
  updates in place (the state the write-back tests follow); ``batch_norm`` options go to the
  BatchNorm (``use_running_average``, ``axis_name``);
- ``ReluBlock``: the same, then a ReLU;
- ``Headed``: a ``ReluBlock`` (``block``) then an ``nnx.Linear`` (``head``).

The sizes are arguments; the attribute names are fixed, as the tests' messages name them
(``model.block.bn.mean``).
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx


class Block(nnx.Module):
    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs, **batch_norm: Any):
        self.linear = nnx.Linear(din, dout, rngs=rngs)
        self.bn = nnx.BatchNorm(dout, rngs=rngs, **batch_norm)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.linear(x))


class ReluBlock(Block):
    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(super().__call__(x))


class Headed(nnx.Module):
    def __init__(self, din: int, width: int, dout: int, *, rngs: nnx.Rngs):
        self.block = ReluBlock(din, width, rngs=rngs)
        self.head = nnx.Linear(width, dout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.block(x))
