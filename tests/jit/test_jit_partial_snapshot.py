"""What ``jit_partial``'s snapshot may trust (docs/semantics.md, "jit_partial"): it answers
from the flatten it made only where it can show that a flatten now would give the same
children and aux data; elsewhere (a registered node's flatten reading C-level state, another
object's attributes or a module-level setting) that node's flatten runs again at each check.
Checked against plain Python with CPython's internals on and, in a subprocess, switched off
(``TREECLONE_NO_CPYTHON_INTERNALS=1``, read at import), which must change nothing but the
cost."""

from __future__ import annotations

import collections
import sys

import jax
import jax.numpy as jnp
import profiles
import pytest
import treeclone as tc
from bound_changes import (
    FACTORIES,
    MODE,
    Built,
    Hidden,
    Moded,
    apply,
    changes,
    flip_mode,
    mode_of,
    specs,
)
from bound_changes import summary as summary_fn
from helpers import check_without_internals
from hypothesis import HealthCheck, example, given, settings

WATCHED = tc._native.cpython_internals()[0] == "on"

# Each example traces and compiles at every call whose structure or aux data changed: a
# fraction of the profile's budget, scaled with it (tests/support/profiles.py).
SETTINGS = settings(
    max_examples=profiles.max_examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(specs, changes, changes)
# The three cases of issue 57, always run besides the generated ones.
@example({"z": ("ddict", {"a": ("leaf", 1)})}, [(0, "factory")], [])
@example({"z": ("hidden", "int"), "y": ("nnx", 1)}, [(0, "hidden")], [])
@example({"z": ("moded", ("leaf", 0)), "y": ("eqx", ("leaf", 2))}, [(0, "mode")], [(1, "static")])
def test_jit_partial_equals_plain_python_whatever_changes_between_calls(spec, first, second):
    """Every container kind bound, changed between calls by two programs in turn (a leaf
    replaced, a hidden child behind a shared small int, ``True`` or cached array, a
    ``defaultdict``'s factory reassigned, a module-level mode flipped, static data set, a
    dict reordered, an entry added): each call's result and the caller's objects equal plain
    Python's."""
    MODE["train"] = True
    ours, plain = Built(spec, jnp), Built(spec, __import__("numpy"))
    step = tc.jit_partial(summary_fn, ours.tree)
    for round_, program in enumerate((first, second, second, [])):
        got, want = step(1.0), summary_fn(plain.tree, 1.0)
        assert float(got) == pytest.approx(float(want), rel=1e-5), (round_, spec, program)
        flip_mode(program)
        apply(ours, program, round_)
        apply(plain, program, round_)
    assert float(ours.tree["n"]) == float(plain.tree["n"]) == 4.0
    got_leaves = [jnp.asarray(v).tolist() for v in jax.tree.leaves(ours.tree)]
    want_leaves = [jnp.asarray(v).tolist() for v in jax.tree.leaves(plain.tree)]
    assert got_leaves == want_leaves


def test_the_property_holds_with_the_internals_switched_off():
    """The same property test in a process that reads no CPython internals (the switch is
    read once at import): every call flattens the bound arguments, with the same results."""
    if not WATCHED:
        pytest.skip("this process already runs with the internals off")
    check_without_internals(
        __file__, "test_jit_partial_equals_plain_python_whatever_changes_between_calls"
    )


def _both(fun, make, change, *args):
    """``fun(bound, *args)`` through jit_partial (called once before ``change``) and in plain
    Python, after ``change`` made to each."""
    ours, plain = make(), make()
    p = tc.jit_partial(fun, ours)
    p(*args)
    fun(plain, *args)
    change(ours)
    change(plain)
    return float(p(*args)), float(fun(plain, *args))


def test_a_defaultdicts_factory_reassigned_between_calls_is_used():
    """A ``defaultdict``'s ``default_factory`` is C-level state (no ``__dict__``, no slot),
    in its flatten's aux data: the old factory was used."""

    def change(d):
        d.default_factory = FACTORIES[1]

    ours, plain = _both(
        lambda d, x: d["w"].sum() * x + d.default_factory(),
        lambda: collections.defaultdict(FACTORIES[0], {"w": jnp.ones(2)}),
        change,
        1.0,
    )
    assert ours == plain == 22.0


@pytest.mark.parametrize("shared", ["int", "true", "array"])
def test_a_child_read_through_another_object_changed_between_calls_is_used(shared):
    """``Hidden``'s flatten reads ``h.x`` through an object nothing watches; the same object (a
    small int, ``True``, a cached array) in the watched attribute ``a`` made the child look
    watched, and its change was missed."""
    cached = jnp.full((2,), 7.0)
    old, new = {"int": (1, 5), "true": (True, False), "array": (cached, jnp.ones(2))}[shared]

    def change(h):
        h.h.x = new

    ours, plain = _both(
        lambda h, x: jnp.sum(jnp.asarray(h.h.x, jnp.float32)) * x,
        lambda: Hidden(old, old),
        change,
        1.0,
    )
    assert ours == plain


def test_aux_data_a_flatten_reads_from_a_module_setting_is_used():
    """``Moded``'s flatten puts a module-level train/eval setting in its aux data: flipped
    between calls, the old aux data was used."""

    def change(_):
        MODE["train"] = False

    MODE["train"] = True
    try:
        ours, plain = _both(
            lambda m, x: m.w.sum() * (1.0 if mode_of(m) else 0.0) + x,
            lambda: Moded(jnp.ones(2)),
            change,
            1.0,
        )
    finally:
        MODE["train"] = True
    assert ours == plain == 1.0


def test_only_flattens_that_read_what_is_watched_skip_the_check_flatten():
    """The cost (counted, not timed): an nnx model, an equinox model (its flatten, generated
    by equinox, reads only the instance dict) and a dict of arrays are checked without
    running any flatten; a node whose flatten is other Python code (a ``defaultdict``'s, a
    class's own) runs it, one level, once per check."""
    if not WATCHED:
        pytest.skip("nothing is watched: the bound arguments are flattened at every call")
    nnx = pytest.importorskip("flax.nnx")
    eqx = pytest.importorskip("equinox")

    def sizes(bound, **options):
        p = tc.jit_partial(lambda b: None, bound, **options)
        p()
        p()
        return p._bound.snapshot.checkable, p._bound.snapshot.flattened_at_each_check

    model = nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Linear(3, 1, rngs=nnx.Rngs(1)))
    assert sizes(model) == (True, 0)
    assert sizes({"w": jnp.ones(2), "b": [jnp.zeros(2)]}) == (True, 0)
    mlp = eqx.nn.MLP(2, 1, 4, 2, key=jax.random.key(0))
    assert sizes(mlp, traced=eqx.is_array) == (True, 0)
    assert sizes(collections.defaultdict(list, {"w": jnp.ones(2)})) == (True, 1)
    assert sizes([Moded(jnp.ones(2)), Moded(jnp.ones(2))]) == (True, 2)


def test_only_equinoxs_own_generated_flatten_is_trusted():
    """An equinox Module's flatten is trusted (not run at each check) only where it is the
    function equinox generates for the class and the class reads ``__dict__`` the plain way:
    a class with its own ``__getattribute__`` is checked by its flatten."""
    eqx = pytest.importorskip("equinox")
    from treeclone._jax_compat import classify_type

    class Plain(eqx.Module):
        w: object
        scale: float = eqx.field(static=True)

    class Redirecting(eqx.Module):
        w: object

        def __getattribute__(self, name):
            return object.__getattribute__(self, name)

    assert classify_type(Plain)[0] is tc._native.TypeKind.EqxModule
    assert classify_type(Redirecting)[0] is tc._native.TypeKind.Custom
    assert classify_type(Moded)[0] is tc._native.TypeKind.Custom


def test_calls_from_several_threads_run_the_check_flattens_without_error():
    """The check runs a node's flatten (Python code, where another thread may run and call
    the same jit_partial) on a copy of its record, the snapshot not borrowed meanwhile: no
    thread gets the native object's "Already borrowed"."""
    import threading
    import time

    @jax.tree_util.register_pytree_node_class
    class Yielding:
        def __init__(self, w):
            self.w = w

        def tree_flatten(self):
            time.sleep(0)  # lets another thread run
            return (self.w,), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

    state = {"layers": [Yielding(jnp.ones(2)) for _ in range(10)], "n": jnp.zeros(())}

    def step(s, x):
        s["n"] = s["n"] + x

    p = tc.jit_partial(step, state)
    p(1.0)
    errors = []

    def run():
        try:
            for _ in range(50):
                p(1.0)
        except Exception as exc:  # noqa: BLE001 - any error is the failure
            errors.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
