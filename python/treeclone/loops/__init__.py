"""``treeclone.scan``, ``fori_loop`` and ``while_loop``: the loops, all of them.

The map, in the order a call meets it:

- ``loop.py``: :func:`scan`, :func:`fori_loop` and :func:`while_loop` (the face): each runs
  the JAX loop over one loop call, and keeps the functions JAX traces per kind of call;
- ``carry.py``: one loop call through the lift (``LoopCall``): the carry flattened with
  identity, the body run through the trace's steps, the final write-back;
- ``rules.py``: the loops' own rules, checked at trace time: the names of a loop's inputs,
  what a body did to a container, the body's slice of ``xs``, the carry's structure.

The lift (``treeclone._lift``) is what the loops share with every other transformation; nothing
here is used by another transformation.
"""

from treeclone.loops.loop import fori_loop, scan, while_loop

__all__ = ["fori_loop", "scan", "while_loop"]
