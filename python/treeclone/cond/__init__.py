"""``treeclone.cond`` and ``treeclone.switch``: the cond transformation, all of it.

The map:

- ``branches.py``: :func:`cond` and :func:`switch` (the face), each branch traced through the
  lift, and the call with a concrete predicate (``treeclone.call``);
- ``join.py``: the branches' traces joined into one plan: every branch must leave the same
  structure behind, and one plan writes back whatever any branch writes.

The lift (``treeclone._lift``) is what cond shares with every other transformation; of another
transformation it uses ``treeclone.call``'s public function alone, and nothing here is used by
another transformation.
"""

from treeclone.cond.branches import cond, switch

__all__ = ["cond", "switch"]
