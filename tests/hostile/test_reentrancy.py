"""Python code that runs in the middle of a traversal must never crash the process.

Any allocation can start the cyclic GC, whose finalizers and weakref callbacks run arbitrary
Python code; so can ``__hash__``, ``__eq__``, ``is_leaf`` and flatten functions, and another
thread can run whenever Python code does. Each test here runs every traversal with
``gc.set_threshold(1)`` while finalizers mutate (clear, grow, shrink, rebind) the very container
being traversed, in a subprocess, so that a segfault fails the test instead of killing pytest.
A traversal may return a result or raise a Python ``Exception``; it may not crash, hang or raise a
``BaseException`` such as PyO3's ``PanicException``.
"""

from __future__ import annotations

import re

from helpers import LONG, run_script

# Rounds of every container kind x mutation x traversal, each round's keys new: about 10,000
# traversals in CI (16 rounds), 260,000 under TREECLONE_LONG=1.
ROUNDS = 400 if LONG else 16

# Shared by the scripts below: containers of each kind, mutations a finalizer may make to them,
# and every traversal that walks them.
SETUP = """
import collections, gc, threading, weakref
import numpy as np
import jax.tree_util as jtu
import treeclone
import treeclone._native
import treeclone.tree_util as tc

class Cyclic:
    '''Garbage only the cyclic GC frees, so its finalizer runs at a GC pass.'''

def arm(action, times):
    # Run `action` at each of the next `times` GC passes (each run re-arms the next).
    def fire():
        action()
        if times > 1:
            arm(action, times - 1)
    c = Cyclic(); c.me = c
    weakref.finalize(c, fire)

@jtu.register_pytree_node_class
class Box:
    def __init__(self, items): self.items = items
    def tree_flatten(self): return list(self.items), None
    @classmethod
    def tree_unflatten(cls, aux, children): return cls(list(children))

try:  # flax nnx's nodes, whose flatten runs natively (rust/node/known.rs)
    from flax import nnx
    from flax.typing import HashableMapping
except ImportError:
    nnx = None
else:
    class Mod(nnx.Module):
        def __init__(self, t):
            for i in range(8):
                setattr(self, f"m{i}-{t}", nnx.data({f"v{i}": float(i)}))
                setattr(self, f"s{i}-{t}", i)

    _prototypes = {}

def nnx_module(t):
    # A copy of a prototype: making an nnx Module is far slower than this.
    if t not in _prototypes:
        _prototypes[t] = Mod(t)
    proto = _prototypes[t]
    new = object.__new__(Mod)
    vars(new).update({k: dict(v) if type(v) is dict else v for k, v in vars(proto).items()})
    return new

def target(c):
    # What a finalizer mutates: a container, or an nnx Module's own __dict__.
    return vars(c) if nnx is not None and isinstance(c, nnx.Module) else c

def containers(t):
    s = {f"k{i}-{t}": float(i) for i in range(40)}
    n = {i * 7919 + t: [float(i)] for i in range(40)}
    l = [{f"x{i}-{t}": i} for i in range(30)]
    o = collections.OrderedDict((f"o{i}-{t}", (i, [i])) for i in range(20))
    b = Box([{f"b{i}-{t}": i} for i in range(20)])
    kinds = {"str-dict": s, "int-dict": n, "list": l, "ordered": o, "box": b}
    if nnx is not None:
        kinds["nnx"] = nnx_module(t)
    return kinds

def mutations(c):
    d = target(c)
    yield lambda: d.clear() if hasattr(d, "clear") else None
    yield lambda: d.update({f"new{i}": i for i in range(50)}) if isinstance(d, dict) else None
    yield lambda: d.popitem() if isinstance(d, dict) and d else None
    yield lambda: c.extend(range(50)) if isinstance(c, list) else None
    if nnx is not None and isinstance(c, nnx.Module):  # no attribute is data any more
        yield lambda: d.__setitem__("_pytree__nodes", HashableMapping({}))
    else:
        yield lambda: setattr(c, "items", []) if isinstance(c, Box) else None

def traversals(c, twin):
    # Each traversal of `c`; `twin`, an equal tree of other objects, gives the treedef and the
    # leaves, so that `c` itself is met for the first time (no cached key order).
    try:  # another thread may be mutating `twin`
        td, leaves = tc.tree_structure(twin), tc.tree_leaves(twin)
    except Exception:
        td, leaves = tc.tree_structure(None), []
    yield "flatten", lambda: tc.tree_flatten(c)
    yield "leaves", lambda: tc.tree_leaves(c)
    yield "structure", lambda: tc.tree_structure(c)
    yield "with_path", lambda: tc.tree_flatten_with_path(c)
    yield "tree_map", lambda: tc.tree_map(lambda x: x, c)
    yield "tree_map_is_leaf", lambda: tc.tree_map(lambda x: x, c, is_leaf=lambda x: False)
    yield "flatten_up_to", lambda: td.flatten_up_to(c)
    yield "unflatten", lambda: tc.tree_unflatten(td, leaves)
    yield "flatten_shared", lambda: treeclone._native.flatten_shared(c)
    yield "shared_unflatten", lambda: treeclone._native.flatten_shared(c)[1].unflatten(leaves)
    yield "cycle_check", lambda: treeclone._native.check(c)  # what check_cycles runs
    yield "check_arguments", lambda: treeclone._native.check_arguments(  # jit's clone call
        (c, 1, c), {"k": c, "s": 2}, frozenset({1, -1}), frozenset({"s"})
    )
    yield "unflatten_floor", lambda: treeclone._native.unflatten_floor(td, leaves)
    yield "snapshot", lambda: _snapshot(c)  # jit_partial's check of its bound arguments
    for policy in ("clone", "alias", "strict"):
        yield f"call-{policy}", lambda p=policy: treeclone.call(lambda x: x, c, policy=p)
        yield f"call-{policy}-mutate", lambda p=policy: treeclone.call(_poke, c, policy=p)

def _snapshot(x):
    leaves, sdef, objects = treeclone._native.flatten_shared(x)
    nodes = [
        i for i, e in enumerate(sdef.node_info())
        if isinstance(e, treeclone._native.EntryInfo.Node)
    ]
    snapshot = treeclone._native.Snapshot.take(objects, sdef, leaves)
    snapshot.unchanged()
    snapshot.refresh(nodes, [[leaf] for leaf in leaves])  # every leaf replaced
    snapshot.unchanged()
    snapshot.refresh(nodes, leaves[:1])  # fewer leaves than taken with: indices out of range
    snapshot.unchanged()

def _poke(x):
    if isinstance(x, dict):
        x["poked"] = 1
    elif isinstance(x, list):
        x.append(1)
    return x

def attempt(fn):
    try:
        fn()
    except Exception:
        pass  # a clean Python error is allowed; a BaseException or a crash is not

# What the imports made (JAX's and flax's modules) is left out of the GC passes, which a
# threshold of 1 makes constant; the containers and finalizers, made later, are not.
gc.freeze()
"""


def test_gc_finalizers_mutating_the_container_being_traversed():
    out = run_script(
        SETUP
        + f"""
count = 0
for t in range({ROUNDS}):
    for kind in containers(t):
        for m in range(5):
            names = [name for name, _ in traversals(None, None)]
            for name in names:
                c = containers(t)[kind]
                fn = dict(traversals(c, containers(t)[kind]))[name]
                action = list(mutations(c))[m]
                arm(action, 20)
                gc.set_threshold(1)
                try:
                    attempt(fn)
                finally:
                    gc.set_threshold(700)
                count += 1
print("RUNS", count)
"""
    )
    assert "RUNS" in out


def test_gc_finalizers_never_leave_jit_partial_trusting_a_stale_cache():
    """A finalizer that changes a bound container while jit_partial flattens it again, or
    between that flatten and the snapshot taken after it, must not be recorded by the
    snapshot as if the cache had seen it: the next call would trust the cache and never see
    the change. After each call (its finalizer run by then), wherever the snapshot says
    nothing changed, a flatten must give exactly the cached leaves and structure. Every
    container kind and mutation, the finalizer at each of the first GC passes of the call
    (73 of these 720 runs were stale before the GC was paused there)."""
    out = run_script(
        SETUP
        + """
def arm_at(k, action):
    # Run `action` at the k-th GC pass from now.
    def fire():
        if k <= 1:
            action()
        else:
            arm_at(k - 1, action)
    c = Cyclic(); c.me = c
    weakref.finalize(c, fire)

def as_cached(p):
    b = p._bound
    if not (b.snapshot.checkable and b.snapshot.unchanged()) or b.replaced or b.stale:
        return True  # the next call flattens again
    try:
        leaves, sdef, _ = treeclone._native.flatten_shared(b.args)
    except Exception:
        return False
    return sdef == b.sdef and all(x is y for x, y in zip(leaves, b.leaves))

def ident(h, x):
    return x

stale = runs = 0
for kind in containers(0):
    for m in range(5):
        holder = {"c": containers(0)[kind]}
        p = treeclone.jit_partial(ident, holder)
        p(1.0)
        for k in range(1, 25):
            c = holder["c"] = containers(k)[kind]  # changed: the next call flattens again
            arm_at(k, list(mutations(c))[m])
            gc.set_threshold(1)
            try:
                attempt(lambda: p(1.0))
            finally:
                gc.set_threshold(700)
            gc.collect()  # the finalizer, if it has not run yet
            gc.disable()
            try:
                runs += 1
                if not as_cached(p):
                    stale += 1
                    print("STALE", kind, m, k)
            finally:
                gc.enable()
print("RUNS", runs, "STALE", stale)
"""
    )
    assert re.search(r"RUNS \d+ STALE 0\b", out), out


def test_thread_mutating_shared_containers_during_traversals():
    out = run_script(
        SETUP
        + f"""
import sys
sys.setswitchinterval(1e-6)
shared = containers(0)
stop = threading.Event()

def mutate():
    i = 0
    while not stop.is_set():
        i += 1
        for c in shared.values():
            for action in mutations(c):
                action()
        shared["str-dict"].update({{f"k{{j}}-{{i}}": float(j) for j in range(40)}})
        shared["list"].extend({{f"x{{j}}": j}} for j in range(30))
        shared["box"].items = [{{f"b{{j}}": j}} for j in range(20)]

worker = threading.Thread(target=mutate)
worker.start()
try:
    for _ in range({ROUNDS * 5}):
        for c in list(shared.values()):
            for name, fn in traversals(c, c):
                attempt(fn)
finally:
    stop.set()
    worker.join(timeout=60)
assert not worker.is_alive()
"""
    )
    assert "SCRIPT-OK" in out
