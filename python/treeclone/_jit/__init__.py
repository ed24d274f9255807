"""``treeclone.jit`` and ``treeclone.jit_partial``: the jit transformation, all of it.

The map, in the order a call meets it:

- ``jitted.py``: :class:`Jitted`, what ``treeclone.jit(fun, ...)`` returns. Its ``__call__`` is
  the native ``JitCore``'s (``rust/call/``): under ``clone`` jax.jit's own call, under the other
  policies the native call of the inner jit, and Python only on a cache miss and on an error.
- ``partial.py``: :class:`JitPartial`, ``treeclone.jit_partial``: a jit with its first
  arguments bound, flattened once (``bound.py``: the bound arguments and their snapshot).
- ``options.py``: jax.jit's keywords as treeclone reads them, and the inner jits' registry.
- ``call.py``: one call as the inner jit takes it: its key (structure, static arguments,
  donation, static leaves, placements) and the order of its leaves.
- ``inner.py``: the function the inner ``jax.jit`` traces (:class:`~treeclone._jit.inner.Inner`)
  and what its trace records (``JitRecord``: the write-back plan and the rest).
- ``stages.py``: the end of a call, and the ahead-of-time stages (``trace``, ``lower``,
  ``compile``).
- ``placement.py``: where the arrays go: ``in_shardings``, ``out_shardings`` and the shardings
  that arrays written back keep.

The lift (``treeclone._lift``) is what jit shares with every other transformation; nothing here
is used by another transformation.
"""

from treeclone._jit.jitted import Jitted, jit
from treeclone._jit.partial import JitPartial, jit_partial

__all__ = ["JitPartial", "Jitted", "jit", "jit_partial"]
