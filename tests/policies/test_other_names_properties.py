"""Rule J30 (and L16 for the loops) as a property: a function, loop body, loop condition or
branch that receives the caller's container as an argument and also reaches it (or one of its
sub-containers) through a global or a closure, and changes it there, is rule J30's
``ValueError`` ("changed ... through another name") under ``alias`` and ``strict``, in every
transformation, and the caller's objects are exactly as they were: the same containers, each
holding the same children (by identity), in the same order.

Generated: the tree (every container kind of ``tests/support/mutation_programs.py``, the
registered class whose flatten reads a dict attribute included), the container changed through
the other name (by position), whether that name holds the container itself or the tree's root
it is reached from, the change (replace a child, add one, delete one), its value (traced or a
constant), whether the function also changes its argument, the transformation, the policy,
and whether the other name is a global or a closure. Each example costs one trace (the error
is raised while tracing, before anything compiles).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation_programs import Model, Noted, Stored, bound_trees, containers

# Each example traces once: a fraction of the profile's budget, scaled with it
# (tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TRANSFORMS = [
    "jit",
    "jit_partial_bound",
    "jit_partial_call",
    "call",
    "grad",
    "value_and_grad",
    "vmap",
    "checkpoint",
    "cond",
    "switch",
    "scan",
    "fori_loop",
    "while_loop_body",
    "while_loop_cond",
]
CHANGES = ["replace", "add", "delete"]

# The other name, when it is a global.
OTHER: dict = {}

X = np.arange(2.0, dtype=np.float32)  # the second argument (vmap maps it with the tree)
XS = np.ones((2, 2), np.float32)  # scan's xs


def change(node, kind, value):
    """Change ``node`` (a caller's container) in place: ``kind`` of its children."""
    if isinstance(node, Stored) and kind != "add":
        # The attribute its flatten reads replaced (an entry of that dict changed in place is
        # not seen: test_an_entry_of_an_attribute_held_dict_changed_through_another_name_...).
        node._store = {"w": value}
    elif isinstance(node, (Noted, Model, Stored)):
        if kind == "add":
            node.extra = value
        elif kind == "delete" and isinstance(node, Model):
            del node.history
        else:
            setattr(node, "x" if isinstance(node, Noted) else "w", value)
    elif isinstance(node, dict):
        if kind == "replace" and node:
            node[next(iter(node))] = value
        elif kind == "delete" and node:
            del node[next(iter(node))]
        else:
            node["zz"] = value
    elif kind == "replace" and node:
        node[0] = value
    elif kind == "delete" and node:
        node.pop()
    else:
        node.append(value)


def other_name_writer(tree, position, via_root, kind, traced, through):
    """What the function does through the other name: change the chosen caller's container,
    reached through the global ``OTHER`` or through a closure, either held directly or found
    from the root. Called with a value of the trace (``v``)."""
    target = containers(tree)[position % len(containers(tree))]
    held = tree if via_root else target
    OTHER["held"] = held

    def write(v):
        node = OTHER["held"] if through == "global" else held
        if via_root:
            node = containers(node)[position % len(containers(node))]
        change(node, kind, v + 1.0 if traced else np.full((2,), 7.0, np.float32))

    return write


def touch_argument(t):
    """A change through the argument itself (a leaf child of its root replaced)."""
    slots = list(t) if isinstance(t, dict) else range(len(t))
    for k in slots:
        if not isinstance(t[k], (dict, list, tuple, Noted, Model, Stored)):
            t[k] = t[k] * 1.0
            return


def run(transform, policy, write, also_argument, tree, selector, writer_branch):
    """Call the transformation, its function changing ``tree`` through ``write``."""

    def fun(t, x):
        write(x)
        if also_argument:
            touch_argument(t)
        return jnp.sum(x)

    def pure(t, x):
        return jnp.sum(x) * 2.0

    def body(c, v):
        write(v)
        if also_argument:
            touch_argument(c)
        return c

    if transform == "jit":
        return tc.jit(fun, policy=policy)(tree, X)
    if transform == "jit_partial_bound":
        return tc.jit_partial(fun, tree, policy=policy)(X)
    if transform == "jit_partial_call":
        return tc.jit_partial(lambda b, t: fun(t, b["x"]), {"x": X}, policy=policy)(tree)
    if transform == "call":
        return tc.call(fun, tree, X, policy=policy)
    if transform == "grad":
        return tc.grad(fun, policy=policy)(tree, X)
    if transform == "value_and_grad":
        return tc.value_and_grad(fun, policy=policy)(tree, X)
    if transform == "vmap":
        return tc.vmap(fun, policy=policy)(tree, X)
    if transform == "checkpoint":
        return tc.checkpoint(fun, policy=policy)(tree, X)
    if transform == "cond":
        branches = [pure, fun] if writer_branch % 2 else [fun, pure]
        return tc.cond(selector % 2 == 0, *branches, tree, X, policy=policy)
    if transform == "switch":
        branches = [pure, pure, pure]
        branches[writer_branch % 3] = fun
        return tc.switch(selector % 3, branches, tree, X, policy=policy)
    if transform == "scan":
        return tc.scan(lambda c, x: (body(c, x), None), tree, XS, policy=policy)
    if transform == "fori_loop":
        return tc.fori_loop(0, 2, lambda i, c: body(c, i), tree, policy=policy)
    if transform == "while_loop_body":
        return tc.while_loop(
            lambda c: jnp.asarray(False), lambda c: body(c, jnp.zeros(())), tree, policy=policy
        )
    assert transform == "while_loop_cond"

    def cond_fun(c):
        write(jnp.zeros(()))
        return jnp.asarray(False)

    return tc.while_loop(cond_fun, lambda c: c, tree, policy=policy)


def children_of(node):
    """A container's children, by name, in order (what a change through any name alters)."""
    if isinstance(node, dict):
        return list(node.items())
    if isinstance(node, (list, tuple)):
        return list(enumerate(node))
    items = list(vars(node).items())
    if isinstance(node, Stored):
        items += [("_store", k, v) for k, v in node._store.items()]
    return items


def snapshot(tree):
    """Every container reachable from ``tree`` with its type and children, held by identity."""
    out, seen, agenda = [], set(), [tree]
    while agenda:
        node = agenda.pop()
        if id(node) in seen or not isinstance(node, (dict, list, tuple, Noted, Model, Stored)):
            continue
        seen.add(id(node))
        kids = children_of(node)
        out.append((node, type(node), kids))
        agenda.extend(item[-1] for item in kids)
    return out


def same_as(snap):
    """Whether each container of ``snap`` still has its type and holds the same children."""
    for node, kind, kids in snap:
        now = children_of(node)
        if type(node) is not kind or len(now) != len(kids):
            return False
        for a, b in zip(now, kids, strict=True):
            if a[:-1] != b[:-1] or a[-1] is not b[-1]:
                return False
    return True


def writer_runs(transform, selector, writer_branch):
    """Whether the writing function must run: an eager cond or switch with a concrete
    selector runs the branch taken only (plain Python's ``if``)."""
    if transform == "cond":
        return (selector % 2 == 0) == (writer_branch % 2 == 0)
    if transform == "switch":
        return selector % 3 == writer_branch % 3
    return True


@SETTINGS
@given(
    tree=bound_trees,
    position=st.integers(0, 20),
    via_root=st.booleans(),
    kind=st.sampled_from(CHANGES),
    traced=st.booleans(),
    also_argument=st.booleans(),
    transform=st.sampled_from(TRANSFORMS),
    policy=st.sampled_from(["alias", "strict"]),
    through=st.sampled_from(["global", "closure"]),
    selector=st.integers(0, 5),
    writer_branch=st.integers(0, 5),
)
def test_a_container_also_changed_through_another_name_is_rule_25s_error_everywhere(
    tree,
    position,
    via_root,
    kind,
    traced,
    also_argument,
    transform,
    policy,
    through,
    selector,
    writer_branch,
):
    # docs/semantics.md, rules J30 and L16.
    write = other_name_writer(tree, position, via_root, kind, traced, through)
    before = snapshot(tree)
    try:
        if writer_runs(transform, selector, writer_branch):
            with pytest.raises(ValueError, match="through another name"):
                run(transform, policy, write, also_argument, tree, selector, writer_branch)
        else:
            try:  # the branch not taken: it may be traced, never its write kept
                run(transform, policy, write, also_argument, tree, selector, writer_branch)
            except ValueError as error:
                assert "through another name" in str(error)
        assert same_as(before), "the caller's objects changed"
    finally:
        OTHER.clear()


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_an_entry_of_an_attribute_held_dict_changed_through_another_name_is_rule_25s_error(
    policy,
):
    stored = Stored(jnp.zeros(2))
    OTHER["held"] = stored
    w = stored._store["w"]

    def f(t, x):
        OTHER["held"]._store["w"] = x + 1.0  # the dict Stored's flatten reads, through a global
        return jnp.sum(x)

    try:
        with pytest.raises(ValueError, match=r"changed t\._store through another name"):
            tc.jit(f, policy=policy)(stored, X)
        assert stored._store["w"] is w  # put back: no tracer left in the caller's object
    finally:
        OTHER.clear()
