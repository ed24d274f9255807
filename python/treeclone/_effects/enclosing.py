"""Rule J31 (docs/semantics.md): inside an enclosing JAX transformation an alias call never
leaves a tracer of it in an object from outside that transformation.

Every plan that writes back carries an :class:`EnclosingWrites` (``Diffed.plan``, and cond's
joined plans), and the native ``CallPlan.apply`` calls it before anything is written, when
the call runs inside a JAX transformation and one of the outputs is a tracer: one check, in
the write-back every lifted transformation shares (jit, jit_partial, call, grad, vmap,
checkpoint, cond, switch, the loops, shard_map). At the top level it costs one look at JAX's
trace state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.core import Tracer

from treeclone import _native, tree_util
from treeclone._effects.messages import enclosing_write_error
from treeclone._effects.tree import Layout, NodeInfo, Paths, argument_tops
from treeclone._effects.watch import made_for_a_call, traced_by_a_call
from treeclone._jax_compat import keystr, stages_constants, trace_of


class EnclosingWrites:
    """Rule J31's check for one plan: ``name``, the function's name for the message; ``sdef``
    and ``layout``, the caller's call structure the plan's origins point into. Called by
    ``CallPlan.apply`` as ``check(leaves, objects, outputs, writes)``, with the caller's
    leaves and objects (by node of ``sdef``), the computation's outputs and, for each caller
    container about to be written, ``(node, new children)``.

    A traced output bound for a container is refused when the container is from outside the
    transformation: told by the leaves it holds (itself, else the nearest container above it
    in its argument that holds any), all concrete, the container not rebuilt by a treeclone
    transformation running now (which writes concrete values back itself). A container that
    holds one of the transformation's tracers is one it made or copied (``jax.jit``'s and
    ``jax.checkpoint``'s copies of their arguments, a carry built inside): written, as plain
    Python would, and dropped with it where JAX drops it. A container without leaves up to its
    argument (``metrics = {}``) cannot be told apart and is written. So is any container when
    the transformation is a treeclone transformation's own ``grad`` or ``vmap`` (whose trace
    leaves values made from constants concrete, so that a carry made inside its function
    holds concrete leaves): the objects from outside it are its arguments, which it rebuilt.
    """

    __slots__ = ("layout", "name", "sdef")

    def __init__(self, name: str, sdef: Any, layout: Layout):
        self.name, self.sdef, self.layout = name, sdef, layout

    def __call__(self, leaves: list, objects: list, outputs: Sequence[Any], writes: list) -> None:
        traced = {id(x) for x in outputs if isinstance(x, Tracer)}
        if not traced:
            return
        info: list = self.sdef.node_info()
        caller = {id(objects[k]) for k, e in enumerate(info) if isinstance(e, NodeInfo)}
        structure: _Structure | None = None
        for k, children in writes:
            for j, child in enumerate(children):
                found = _traced_in(child, traced, caller)
                if found is None:
                    continue
                tracer, below = found
                trace = trace_of(tracer)
                if traced_by_a_call(trace) and not stages_constants(trace):
                    continue
                if structure is None:
                    structure = _Structure(info, self.layout)
                if structure.outside(k, leaves, objects):
                    path = Paths(self.sdef, objects, self.layout).child(k, j, child) + below
                    raise enclosing_write_error(self.name, tracer, path)


def _traced_in(child: Any, traced: set[int], caller: set[int]) -> tuple[Any, str] | None:
    """The first traced output ``child`` is or holds, with its key path below ``child``; a
    caller's own container is not looked into (its own writes are listed apart)."""
    if id(child) in traced:
        return child, ""
    if id(child) in caller:
        return None
    try:
        pairs = tree_util.tree_flatten_with_path(child)[0]
    except Exception:  # noqa: BLE001 - the write-back reports what cannot be flattened
        return None
    for path, leaf in pairs:
        if id(leaf) in traced:
            return leaf, keystr(path)
    return None


class _Structure:
    """The caller's call structure as rule J31 reads it: each node's parent, within its
    argument, and the leaf slots below each node."""

    def __init__(self, info: list, layout: Layout):
        self.info = info
        self.tops = {top for top, _ in argument_tops(info, layout)}
        self.parent: dict[int, int] = {}
        for n, e in enumerate(info):
            if isinstance(e, NodeInfo):
                for c in e.children:
                    self.parent.setdefault(c, n)

    def slots(self, node: int) -> list[int]:
        """The leaf slots below ``node`` (a shared container's through each reference)."""
        found, agenda, seen = [], [node], set()
        while agenda:
            n = agenda.pop()
            if n in seen:
                continue
            seen.add(n)
            e = self.info[n]
            if isinstance(e, NodeInfo):
                agenda.extend(e.children)
            elif isinstance(e, _native.EntryInfo.Leaf):
                found.append(e.slot)
            else:
                agenda.append(e.target)
        return found

    def outside(self, k: int, leaves: list, objects: list) -> bool:
        """Whether caller node ``k`` is an object from outside the transformation."""
        if made_for_a_call(objects[k]):
            return False
        n: int | None = k
        while n is not None:
            slots = self.slots(n)
            if slots:
                return not any(isinstance(leaves[s], Tracer) for s in slots)
            if n in self.tops:
                return False
            n = self.parent.get(n)
        return False
