"""The lift: the call every transformation makes, whatever its policy, in one place.

A transformation under a policy other than ``clone`` does three things, each done here once:

1. **flatten the call** (``arguments``: :func:`flatten_call` -> :class:`Call`): the arguments,
   with identity (the same array passed twice is one input, a shared container one object),
   static arguments taken out and kept, hashed, as part of the call's structure; a cycle is
   the ``ValueError`` of every policy, naming the argument (also :func:`check_cycles`, all a
   call adds under ``clone``);
2. **run the function at trace time** (``runner``: :func:`begin`, then ``_effects``'s steps):
   rebuild the arguments from the leaves the JAX transformation hands in (tracers), run the
   user's function on them and record what it did as a native ``CallPlan``. The plan leaves
   the transformed function as the static data of an :class:`Out` node (``boxes``), so it is
   found in JAX's output structure even when JAX reuses a cached trace, and the
   computation's outputs are its leaves;
3. **apply the plan** to the concrete outputs (``out.record.plan.apply(leaves, objects,
   out.leaves)``): it rebuilds the result and, under ``alias``, writes the mutations into the
   caller's objects, all or nothing.

The leaves may be tracers of an outer transformation: the lift works the same inside ``jit``,
``grad`` or another lift, and its write-back then lands in the outer trace's rebuilt objects,
where the outer lift sees it. ``naming`` names arguments and leaves as jax's messages do;
``wrapper`` is what every transformation's wrapper shares, ``kept`` what a transformation keeps
between calls so that JAX finds its traces again. This module is the package's API
for the transformations; the lift imports none of them.
"""

from treeclone._lift.arguments import (
    Call,
    Static,
    StaticLeaves,
    Statics,
    check_cycles,
    flatten_call,
    is_array,
    leaf_rule,
    normalize,
)
from treeclone._lift.boxes import ArgsBox, LiftRecord, Out, StaticOut, as_jit_outputs, take
from treeclone._lift.kept import Kept
from treeclone._lift.naming import Naming, argument_names, debug_info, jit_keystr, name_slots
from treeclone._lift.runner import Runner, begin, current_policy, reporting, with_static
from treeclone._lift.wrapper import Decorator, FunOrDecorator, Wrapper, fun_or_decorator

__all__ = [
    "ArgsBox",
    "Call",
    "Decorator",
    "FunOrDecorator",
    "Kept",
    "LiftRecord",
    "Naming",
    "Out",
    "Runner",
    "Static",
    "StaticLeaves",
    "StaticOut",
    "Statics",
    "Wrapper",
    "argument_names",
    "as_jit_outputs",
    "begin",
    "check_cycles",
    "current_policy",
    "debug_info",
    "flatten_call",
    "fun_or_decorator",
    "is_array",
    "jit_keystr",
    "leaf_rule",
    "name_slots",
    "normalize",
    "reporting",
    "take",
    "with_static",
]
