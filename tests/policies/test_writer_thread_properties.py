"""Rule J20 (entry by entry) as a property: a write-back sets the entries the function changed
and nothing else, so what another thread writes into other entries of the same containers
while the calls run is never reverted to the value read at call start.

Generated: the container the entries live in (a dict, an ``OrderedDict``, a list, a
registered dict or list subclass, a registered class with one attribute per entry), whether it
sits inside another container (a dict, a list or a registered class), how many entries it has,
which of them the function updates (``+ x`` at each call) and which, disjoint, a thread writes
(1, 2, 3, ... round the entries, each entry's values increasing), the caller
(``jit_partial`` or ``treeclone.jit(policy="alias")`` on the same objects) and the number of
steps. The steps start once the thread has written (it yields the GIL after each round and
the switch interval is tiny, so they interleave); nothing depends on timing: after every step
its own updates are written, the thread's entries never go backwards, and after the join each
holds the thread's last write. (The first call traces before the thread starts: a write made
by another thread while a call traces is taken for rule J30's change through another name.)
"""

from __future__ import annotations

import collections
import functools
import itertools
import sys
import threading
import time

import jax
import jax.numpy as jnp
import profiles
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from node_kinds import MyDict, MyList

# Each example traces and compiles once: a fraction of the profile's budget, scaled with it
# (tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@jax.tree_util.register_pytree_node_class
class Slots:
    """A registered class with one attribute per entry (``e0``, ``e1``, ...)."""

    def __init__(self, **entries):
        self.__dict__.update(entries)

    def tree_flatten(self):
        names = sorted(vars(self))
        return [getattr(self, n) for n in names], tuple(names)

    @classmethod
    def tree_unflatten(cls, names, children):
        return cls(**dict(zip(names, children, strict=True)))


INNER = ["dict", "ordereddict", "mydict", "list", "mylist", "node"]
OUTER = [None, "dict", "list", "node"]


def make_inner(kind, values):
    names = [f"e{i}" for i in range(len(values))]
    if kind == "dict":
        return dict(zip(names, values, strict=True))
    if kind == "ordereddict":
        return collections.OrderedDict(zip(names, values, strict=True))
    if kind == "mydict":
        return MyDict(zip(names, values, strict=True))
    if kind == "list":
        return list(values)
    if kind == "mylist":
        return MyList(values)
    return Slots(**dict(zip(names, values, strict=True)))


def wrap(outer, inner):
    """The state passed to the function: ``inner``, or ``inner`` inside ``outer`` next to a
    leaf nobody touches."""
    if outer is None:
        return inner
    if outer == "dict":
        return {"other": jnp.ones(()), "inner": inner}
    if outer == "list":
        return [jnp.ones(()), inner]
    return Slots(inner=inner, other=jnp.ones(()))


def unwrap(outer, state):
    if outer is None:
        return state
    if outer == "dict":
        return state["inner"]
    if outer == "list":
        return state[1]
    return state.inner


def read(inner, i):
    return getattr(inner, f"e{i}") if isinstance(inner, Slots) else inner[_key(inner, i)]


def write(inner, i, value):
    if isinstance(inner, Slots):
        setattr(inner, f"e{i}", value)
    else:
        inner[_key(inner, i)] = value


def _key(inner, i):
    return f"e{i}" if isinstance(inner, dict) else i


@st.composite
def layouts(draw):
    """The container kinds, the entries and who writes which: (inner, outer, size, mine,
    theirs), ``mine`` and ``theirs`` disjoint and non-empty."""
    size = draw(st.integers(2, 6))
    owner = draw(st.lists(st.sampled_from("mto"), min_size=size, max_size=size))
    mine_at, theirs_at = draw(st.integers(0, size - 1)), draw(st.integers(0, size - 2))
    owner[mine_at] = "m"
    theirs_at = [i for i in range(size) if i != mine_at][theirs_at]
    owner[theirs_at] = "t"
    mine = [i for i, o in enumerate(owner) if o == "m"]
    theirs = [i for i, o in enumerate(owner) if o == "t"]
    return draw(st.sampled_from(INNER)), draw(st.sampled_from(OUTER)), size, mine, theirs


def run_against_writer(inner_kind, outer, size, mine, theirs, caller, steps):
    """``steps`` calls updating entries ``mine`` of the state while a thread writes entries
    ``theirs``; returns each step's reading of both, the thread's last writes and the final
    reading of ``theirs``."""
    values = [jnp.zeros(()) if i in mine else 0 for i in range(size)]
    state = wrap(outer, make_inner(inner_kind, values))

    def update(s, x):
        target = unwrap(outer, s)
        for i in mine:
            write(target, i, read(target, i) + x)

    step = (
        tc.jit_partial(update, state)
        if caller == "partial"
        else functools.partial(tc.jit(update, policy="alias"), state)
    )
    step(1.0)  # traced before the thread starts
    inner = unwrap(outer, state)
    stop, started = threading.Event(), threading.Event()
    last = dict.fromkeys(theirs, 0)

    def writer():
        for n in itertools.count(1):
            if stop.is_set():
                return
            for i in theirs:
                write(inner, i, n)
                last[i] = n
            started.set()
            time.sleep(0)  # hands the GIL over: the writes spread over the steps

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=writer)
    thread.start()
    seen = []
    try:
        started.wait(timeout=60)  # the thread has written once: it runs as the steps do
        for _ in range(steps):
            step(1.0)
            seen.append(([float(read(inner, i)) for i in mine], [read(inner, i) for i in theirs]))
    finally:
        stop.set()
        thread.join(timeout=60)
        sys.setswitchinterval(interval)
    assert not thread.is_alive()
    return seen, last, [read(inner, i) for i in theirs]


@SETTINGS
@given(
    layout=layouts(),
    caller=st.sampled_from(["partial", "jit"]),
    steps=st.integers(50, 300),
)
def test_a_writer_threads_entries_are_never_reverted_whatever_the_containers(layout, caller, steps):
    # docs/semantics.md, rule J20.
    inner_kind, outer, size, mine, theirs = layout
    seen, last, final = run_against_writer(inner_kind, outer, size, mine, theirs, caller, steps)
    for n, (own, _) in enumerate(seen, start=2):  # the first call was before the thread
        assert own == [float(n)] * len(mine), f"step {n - 1}'s own update was not written"
    for j in range(len(theirs)):
        column = [other[j] for _, other in seen]
        assert all(a <= b for a, b in itertools.pairwise(column)), "a thread's entry went back"
    assert final == [last[i] for i in theirs]
