"""The kinds of mesh JAX makes, for the mesh tests to run on each (docs/semantics.md,
"Shardings"; issue 57).

A kind is how the mesh is made and how it is made current:

- ``Mesh``: ``jax.sharding.Mesh(devices, names)`` (Auto axes), used as it is;
- ``auto``: ``jax.make_mesh(shape, names, axis_types=Auto...)``;
- ``explicit``: ``jax.make_mesh(shape, names, axis_types=Explicit...)`` (its default from
  JAX 0.8 on): arrays carry their sharding in their type, and ``with_sharding_constraint``
  refuses the axes;
- ``mixed``: the first axis Explicit, the others Auto (a 1-D mesh: ``explicit``);
- ``...+set_mesh``: the same mesh, current under ``jax.set_mesh`` (``jax.sharding.use_mesh`` on
  JAX 0.6, which has no ``jax.set_mesh``);
- ``Mesh+with``: a ``Mesh`` current under ``with mesh:`` (deprecated on JAX 0.10, still there).

:func:`unavailable` says why the installed JAX cannot make a kind (the test is then skipped,
saying why); :func:`make` makes the mesh, :func:`current` makes it current for a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

KINDS = (
    "Mesh",
    "auto",
    "explicit",
    "mixed",
    "Mesh+set_mesh",
    "explicit+set_mesh",
    "Mesh+with",
)


def _axis_type() -> Any:
    return getattr(jax.sharding, "AxisType", None)


def _set_mesh() -> Any:
    """``jax.set_mesh`` (JAX >= 0.7), or ``jax.sharding.use_mesh`` (0.6), or None."""
    return getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)


def unavailable(kind: str) -> str | None:
    """Why the installed JAX cannot make a mesh of ``kind`` (None: it can)."""
    base, _, use = kind.partition("+")
    if base in ("auto", "explicit", "mixed") and _axis_type() is None:
        return f"jax {jax.__version__} has no jax.sharding.AxisType"
    if use == "set_mesh" and _set_mesh() is None:
        return f"jax {jax.__version__} has neither jax.set_mesh nor jax.sharding.use_mesh"
    return None


def make(kind: str, shape: Sequence[int], names: Sequence[str]) -> Any:
    """A mesh of ``kind`` over the first ``prod(shape)`` devices."""
    base = kind.partition("+")[0]
    if base == "Mesh":
        devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
        return jax.sharding.Mesh(devices, tuple(names))
    types = _axis_type()
    if base == "auto":
        axis_types = (types.Auto,) * len(shape)
    elif base == "explicit":
        axis_types = (types.Explicit,) * len(shape)
    else:
        axis_types = (types.Explicit,) + (types.Auto,) * (len(shape) - 1)
    return jax.make_mesh(tuple(shape), tuple(names), axis_types=axis_types)


@contextlib.contextmanager
def current(kind: str, mesh: Any) -> Iterator[None]:
    """``mesh`` made current as ``kind`` says (nothing for a kind without ``+``)."""
    use = kind.partition("+")[2]
    if use == "set_mesh":
        with _set_mesh()(mesh):
            yield
    elif use == "with":
        with mesh:
            yield
    else:
        yield
