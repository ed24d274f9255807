"""A call's effects: the function run on rebuilt inputs, and what it did to them.

Used at trace time by every transformation through the lift (``treeclone._lift``; the leaves
are tracers) and eagerly by ``treeclone.call`` (the leaves are the caller's values). The
result is a native ``CallPlan`` that rebuilds the outputs (and, under ``alias``, writes the
inputs' new contents back into the caller's objects) at every call, plus the leaves the
computation must output. One module per concern:

- ``steps``: the steps of a trace (``Request`` -> ``prepare`` -> ``call`` -> ``diff`` ->
  ``plan``) and the records between them;
- ``tree``: the flattened structure, its key paths (``Paths``) and its comparisons;
- ``diff``: what changed in a container, in words;
- ``consumed``: inputs the function consumed (equinox's ``State`` once set): each takes its
  successor's contents;
- ``writes``: what alias writes back (``container_writes``: the ``Origin`` of each container),
  each container's policy, and where the leaves are after a call (``jit_partial``);
- ``watch``: what is watched while the function runs (the caller's containers, strict's
  static objects, the containers rebuilt for a running call);
- ``messages``: strict's ``MutationError``, clone's report and the other errors;
- ``discards``: clone's report for a function run by JAX's own transformation.

This module is the package's API for the rest of treeclone.
"""

from treeclone._effects.consumed import take_successors
from treeclone._effects.discards import ReportingDiscards, reporting_discards
from treeclone._effects.messages import (
    enclosing_write_error,
    mutation_error,
    policy_name,
    qualname,
    raise_outside_attribute,
    report_discarded,
    traced_remedy,
)
from treeclone._effects.steps import (
    Called,
    Diffed,
    Plan,
    Prepared,
    Request,
    StaticArgs,
    prepare,
)
from treeclone._effects.tree import (
    NAN_TYPES,
    ChildKeys,
    Layout,
    Paths,
    child_keys,
    equal_empty_nodes,
    holds_tracer,
    is_nan,
    same_data,
    same_static,
    static_hash,
    static_key,
    unstable_static_data,
)
from treeclone._effects.watch import (
    Same,
    check_callers,
    made_for_a_call,
    shallow_state,
    watch_callers,
)

__all__ = [
    "NAN_TYPES",
    "Called",
    "ChildKeys",
    "Diffed",
    "Layout",
    "Paths",
    "Plan",
    "Prepared",
    "ReportingDiscards",
    "Request",
    "Same",
    "StaticArgs",
    "check_callers",
    "child_keys",
    "enclosing_write_error",
    "equal_empty_nodes",
    "holds_tracer",
    "is_nan",
    "made_for_a_call",
    "mutation_error",
    "policy_name",
    "prepare",
    "qualname",
    "raise_outside_attribute",
    "report_discarded",
    "reporting_discards",
    "same_data",
    "same_static",
    "shallow_state",
    "static_hash",
    "static_key",
    "take_successors",
    "traced_remedy",
    "unstable_static_data",
    "watch_callers",
]
