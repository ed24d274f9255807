"""``treeclone.vmap``: the vmap transformation, all of it.

The map:

- ``batched.py``: :func:`vmap`, its wrapper and the runner ``jax.vmap`` maps (the face: the
  call through the lift, and ``jax.vmap``'s own under ``clone``);
- ``axes.py``: the batch axes under a policy: of each input leaf, from ``in_axes``, and of
  each leaf of the result, from where it ends up once the function has run.

The lift (``treeclone._lift``) is what vmap shares with every other transformation; nothing here
is used by another transformation.
"""

from treeclone.vmap.batched import vmap

__all__ = ["vmap"]
