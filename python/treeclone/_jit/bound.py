"""``jit_partial``'s bound arguments, flattened once (:class:`BoundArguments`): each call
flattens only its own arguments and joins the two structures (``join``), flattening the bound
ones again only when their snapshot (``rust/bound``) says they changed, and follows the call's
write-back into them (``bound_advance``). Both run natively (``rust/call/bound_args.rs``, in the
native call, ``LeanCall``, of every ``jit_partial`` call and stage, with no Python frame),
reading and writing this object's attributes; ``flatten`` is Python, run when the bound
arguments changed; ``treeclone.jit``'s native call keeps its leading arguments' flatten in one
made in weak mode, which holds none of them (``rust/call/kept.rs``, docs/semantics.md rule
J32).
And what ``jit_partial`` uses of the jitted function it binds (:class:`JitInterface`, made
by ``Jitted.interface()``).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import threading
from collections.abc import Callable
from typing import Any

from treeclone import _native
from treeclone._lift import Naming, check_cycles
from treeclone._native import EntryInfo, SharedTreeDef, Snapshot, Taker


class BoundArguments:
    """The bound arguments of a ``jit_partial``, flattened, with what checks them."""

    def __init__(self, args: tuple, naming: Naming, weak: bool = False):
        # ``weak``: ``args`` are weak references to the arguments (``treeclone.jit``'s cache of
        # its leading arguments, ``rust/call/kept.rs``), and nothing here holds one of them:
        # each call hands them in (``roots``), and ``usable`` says whether the record could
        # be kept without them.
        self.args = args
        self.naming = naming
        self.weak = weak
        self.roots: list[tuple[int, int]] = []  # (entry, argument) the call fills in
        self.usable = True
        # The snapshot's check runs Python code (a registered flatten, a finalizer), where
        # another thread calling the same jit_partial may follow its write-back into the
        # snapshot: the two take turns (a native object read and written at once refuses).
        self.lock = threading.RLock()
        self.flatten()

    def flatten(self) -> None:
        """Flatten the bound arguments (again) and take their snapshot."""
        previous = getattr(self, "sdef", None)
        args = tuple(ref() for ref in self.args) if self.weak else self.args
        counts = [sys.getrefcount(arg) for arg in args] if self.weak else []
        enabled = gc.isenabled()  # paused while the snapshot is taken (module docstring)
        gc.disable()
        try:
            # One native call: no Python code runs between a container's read and its record.
            flat = Snapshot.flatten_and_take(args)
        except ValueError:
            # A cycle: the error names the argument (rule J17), as treeclone.jit's does, not
            # its position in the tuple of bound arguments.
            check_cycles(self.naming, args, {})
            raise
        finally:
            if enabled:
                gc.enable()
        self.leaves, self.sdef, self.objects, self.snapshot = flat
        del flat
        self.stale = False
        self.replaced = False  # the last call replaced bound containers: flatten all, as jit
        # The same structure again (new containers in place of old ones, as after
        # ``state["params"] = optax.apply_updates(...)``) keeps the joined structures and leaf
        # takers: only the objects watched change.
        if previous is None or previous != self.sdef:
            info = self.sdef.node_info()
            self.containers = [i for i, e in enumerate(info) if isinstance(e, EntryInfo.Node)]
            self.leaf_entries = [i for i, e in enumerate(info) if isinstance(e, EntryInfo.Leaf)]
            self.joined: dict[Any, SharedTreeDef] = {}
            self.takers: dict[tuple[int, ...], Taker] = {}
        # Objects a call's arguments must not share with the bound ones: the containers, and
        # the leaves as they are now.
        self.ids = {id(self.objects[i]) for i in self.containers}
        # Not the leaves, which the write-back replaces: a join puts the bound leaves of the
        # moment in their places (``bound_join``), and the arrays replaced are not kept.
        for i in self.leaf_entries:
            self.objects[i] = None
        if self.weak:
            self._let_go(args, counts)
        self.bound_objects = self.objects[:-1]  # without the root, the tuple of the arguments

    def _let_go(self, args: tuple, counts: list[int]) -> None:
        """Weak mode: the record lets go of the arguments themselves (the snapshot holds them
        weakly; the objects hold None in their places, and ``roots`` says which argument each
        place takes at a call). Usable only where the snapshot can be checked and nothing
        kept holds an argument still (their reference counts are back to what they were
        before the flatten): an argument another one refers to, or one some record holds
        otherwise, is not kept."""
        at = {id(arg): i for i, arg in enumerate(args)}
        self.roots = [(k, at[id(obj)]) for k, obj in enumerate(self.objects[:-1]) if id(obj) in at]
        for k, _ in self.roots:
            self.objects[k] = None
        self.objects[-1] = None  # the tuple of the arguments
        try:
            self.snapshot.release(sorted({k for k, _ in self.roots}))
        except TypeError:  # an argument no weak reference can refer to
            self.usable = False
            return
        self.usable = self.snapshot.checkable and counts == [sys.getrefcount(a) for a in args]

    def join(self, args: tuple, kwargs: dict) -> tuple[list, Any, list]:
        """``flatten_shared((*args, kwargs))``, where ``args`` starts with the bound arguments,
        flattening only the others (and the bound ones again if they were changed since):
        ``rust/call/bound_args.rs``, which reads and writes this object's attributes."""
        return _native.bound_join(self, args, kwargs)


@dataclasses.dataclass(frozen=True, slots=True)
class JitInterface:
    """What ``jit_partial`` uses of a ``treeclone.Jitted`` (``Jitted.interface()``), so that
    neither module reads the other's private attributes (``tests/test_import_graph.py``):
    the user's ``fun``; how its arguments are ``naming``-ed; ``static_nums`` and
    ``static_names`` (each completed from the other, as jax.jit does); the function's own
    ``policy``; ``cache_size()``, and
    ``stage(method, args, kwargs, bound, partial)``, the ahead-of-time stages (``lower``,
    ``trace``, ``eval_shape``), ``partial`` the ``JitPartial`` whose stage it is."""

    fun: Callable[..., Any]
    naming: Naming
    static_nums: frozenset[int]
    static_names: frozenset[str]
    policy: Any
    cache_size: Callable[[], int]
    stage: Callable[..., Any]
