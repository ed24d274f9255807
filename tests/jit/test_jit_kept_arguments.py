"""``treeclone.jit`` keeps the flatten of its leading arguments between calls while they are
the same objects (docs/semantics.md, rule J32): ``jit_partial``'s machinery
(``BoundArguments`` with its snapshot, ``rust/call/kept.rs``) in weak mode. Each call equals
plain Python whatever changes between calls, the flatten is made once while nothing changes,
and the cache keeps no argument alive: a dropped model and its arrays are freed.
Checked with CPython's internals on and, in a subprocess, switched off
(``TREECLONE_NO_CPYTHON_INTERNALS=1``: nothing is kept, every call flattens)."""

from __future__ import annotations

import collections
import dataclasses
import gc
import importlib
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from bound_changes import MODE, Built, apply, changes, flip_mode, specs
from bound_changes import summary as summary_fn
from helpers import check_without_internals
from hypothesis import HealthCheck, example, given, settings
from node_kinds import MyDict

bound_module = importlib.import_module("treeclone._jit.bound")
WATCHED = tc._native.cpython_internals()[0] == "on"
SETTINGS = settings(
    max_examples=profiles.max_examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclasses.dataclass
class Batch:
    """A registered dataclass: a node, made anew for each call."""

    x: jax.Array


jax.tree_util.register_dataclass(Batch, data_fields=["x"], meta_fields=[])


def _values(tree) -> list[float]:
    """Every number of the tree's leaves, in flatten order."""
    return [float(n) for v in jax.tree.leaves(tree) for n in np.ravel(np.asarray(v))]


@SETTINGS
@given(specs, changes, changes)
@example({"z": ("ddict", {"a": ("leaf", 1)})}, [(0, "factory")], [])
@example({"z": ("hidden", "int"), "y": ("nnx", 1)}, [(0, "hidden")], [])
@example({"z": ("moded", ("leaf", 0)), "y": ("eqx", ("leaf", 2))}, [(0, "mode")], [(1, "static")])
def test_jit_equals_plain_python_whatever_changes_between_calls(spec, first, second):
    """The same object (a registered dict subclass holding a tree of every container kind)
    passed call after call, changed between calls by two programs in turn as
    ``test_jit_partial_snapshot.py``'s property changes its bound state: each call's result
    and the caller's objects equal plain Python's, while the flatten is kept."""
    MODE["train"] = True
    ours, plain = Built(spec, jnp), Built(spec, np)
    root, plain_root = MyDict(ours.tree), MyDict(plain.tree)
    step = tc.jit(summary_fn, policy="alias")
    rounds = (first, [], second, first, second, [])
    for round_, program in enumerate(rounds):
        x = jnp.asarray(1.0)  # a new array each call: flattened at each
        got, want = step(root, x), summary_fn(plain_root, 1.0)
        assert float(got) == pytest.approx(float(want), rel=1e-5), (round_, spec, program)
        flip_mode(program)
        apply(ours, program, round_)
        apply(plain, program, round_)
    assert float(root["n"]) == float(plain_root["n"]) == len(rounds)
    assert _values(root) == _values(plain_root)


def test_the_property_holds_with_the_internals_switched_off():
    """The same property test where no CPython internals are read: nothing is kept (a
    snapshot could not be checked), with the same results."""
    if not WATCHED:
        pytest.skip("this process already runs with the internals off")
    check_without_internals(__file__, "test_jit_equals_plain_python_whatever_changes_between_calls")


def _nnx_model():
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self):
            self.linear = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
            self.calls = nnx.Variable(jnp.zeros((), jnp.int32))

    return Model()


def _nnx_step(model, x):
    model.calls[...] = model.calls[...] + 1
    model.linear.bias[...] = model.linear.bias[...] - 0.1 * x
    return model.linear(x).sum()


def _flattens(monkeypatch) -> collections.Counter:
    """A count of the flattens of kept (and bound) arguments."""
    counts: collections.Counter = collections.Counter()
    original = bound_module.BoundArguments.flatten

    def counted(self):
        counts["kept"] += 1
        original(self)

    monkeypatch.setattr(bound_module.BoundArguments, "flatten", counted)
    return counts


def test_the_flatten_of_the_same_model_is_kept_and_follows_the_write_back(monkeypatch):
    """An nnx model passed call after call, updated in place by each: flattened for the
    record once (after the second call, where it is met again), then never while nothing
    outside the function changes it; a change between calls flattens it once more. The
    leaves kept are the ones the model holds after each call."""
    flattens = _flattens(monkeypatch)
    model, plain = _nnx_model(), _nnx_model()
    step = tc.jit(_nnx_step, policy="alias")
    x = jnp.ones(3)
    for _ in range(6):
        assert float(step(model, x)) == pytest.approx(float(_nnx_step(plain, x)))
    assert _values(model) == pytest.approx(_values(plain))
    if not WATCHED:
        assert flattens["kept"] == 0 and step._kept() is None  # every call flattens
        return
    assert flattens["kept"] == 1
    kept = step._kept()
    assert kept is not None and kept.weak
    held = {id(leaf) for leaf in kept.leaves}
    assert all(id(leaf) in held for leaf in jax.tree.leaves(model))  # after the write-back
    model.linear.bias[...] = jnp.full(3, 5.0)  # a change between calls
    plain.linear.bias[...] = np.full(3, 5.0)
    for _ in range(2):
        assert float(step(model, x)) == pytest.approx(float(_nnx_step(plain, x)))
    assert flattens["kept"] == 2
    assert _values(model) == pytest.approx(_values(plain))


def test_the_cache_keeps_no_argument_alive():
    """The record refers to the model weakly: dropped by the caller, the model is collected,
    its arrays (those it held after the last write-back) are freed, and the record goes
    with it. An array the write-back replaced is not kept either."""
    model = _nnx_model()
    step = tc.jit(_nnx_step, policy="alias")
    x = jnp.ones(3)
    replaced = []
    for _ in range(4):
        replaced.append(weakref.ref(model.calls.get_value()))
        step(model, x)
    if WATCHED:
        assert step._kept() is not None
    # On a TPU the native call holds the last calls' leaves a while, by design
    # (tests/jit/test_lean_path.py): let go of them, as clear_cache does.
    step._release_held()
    gc.collect()
    assert all(r() is None for r in replaced[:-1])  # replaced by the write-back: freed
    model_ref = weakref.ref(model)
    leaf_refs = [weakref.ref(leaf) for leaf in jax.tree.leaves(model)]
    del model
    gc.collect()
    assert model_ref() is None
    assert all(r() is None for r in leaf_refs)
    assert step._kept() is None


def test_another_model_is_flattened_and_the_kept_one_stays_kept(monkeypatch):
    """Two models in turn: the kept one stays kept, the other is flattened at each call
    (kept only once met twice in a row); both give plain Python's results."""
    flattens = _flattens(monkeypatch)
    a, b, plain_a, plain_b = _nnx_model(), _nnx_model(), _nnx_model(), _nnx_model()
    step = tc.jit(_nnx_step, policy="alias")
    x = jnp.ones(3)
    for model, plain in [(a, plain_a)] * 2 + [(b, plain_b), (a, plain_a)] * 3:
        assert float(step(model, x)) == pytest.approx(float(_nnx_step(plain, x)))
    assert _values((a, b)) == pytest.approx(_values((plain_a, plain_b)))
    assert flattens["kept"] == (1 if WATCHED else 0)


def _replacing(root, x):
    """Replaces a container of its argument at every call (the record ends) and, at the
    first, changes its structure."""
    root["t"] = {"w": root["t"]["w"] + x}
    if "extra" not in root:
        root["extra"] = x
    root["n"] = root["n"] + 1
    return root["t"]["w"].sum()


def _replace_in_place(root, x):
    """Replaces the list it holds by a longer one (a structure change the write-back makes)
    on the first two calls, then updates it in place."""
    if len(root["xs"]) < 3:
        root["xs"] = [*root["xs"], x]
    else:
        root["xs"][0] = root["xs"][0] + x
    root["n"] = root["n"] + 1
    return sum(v.sum() for v in root["xs"])


@pytest.mark.parametrize("fun", [_replacing, _replace_in_place])
def test_a_function_that_replaces_or_restructures_its_argument_equals_plain_python(fun):
    ours = MyDict({"n": jnp.zeros(()), "t": {"w": jnp.ones(2)}, "xs": [jnp.ones(2)]})
    plain = MyDict({"n": np.zeros(()), "t": {"w": np.ones(2)}, "xs": [np.ones(2)]})
    step = tc.jit(fun, policy="alias")
    for _ in range(6):
        assert float(step(ours, jnp.ones(2))) == pytest.approx(float(fun(plain, np.ones(2))))
        assert _values(ours) == pytest.approx(_values(plain))
        assert jax.tree.structure(ours) == jax.tree.structure(plain)


def _counting(root, x):
    root["n"] = root["n"] + x
    root["w"] = root["w"] * 2
    return root["w"].sum()


def _reading(root, x):
    return (root["w"] * x).sum() + root["n"]


@pytest.mark.parametrize(
    ("policy", "donate"), [("alias", False), ("alias", True), ("strict", False)]
)
def test_every_policy_and_donation_give_plain_python_results(policy, donate):
    """Alias (writing into the root) and strict (reading it), donated or not: the same root
    call after call, a leaf replaced between calls; donated arrays are deleted as jax.jit
    deletes them."""
    fun = _counting if policy == "alias" else _reading
    ours = MyDict({"n": jnp.zeros(()), "w": jnp.ones(2)})
    plain = MyDict({"n": np.zeros(()), "w": np.ones(2)})
    step = tc.jit(fun, policy=policy, donate_argnums=0 if donate else None)
    for i in range(6):
        old = ours["w"]
        assert float(step(ours, jnp.asarray(2.0))) == pytest.approx(float(fun(plain, 2.0)))
        assert _values(ours) == pytest.approx(_values(plain))
        assert old.is_deleted() == donate
        if i == 3:  # changed between calls
            ours["w"], plain["w"] = jnp.full(2, 3.0), np.full(2, 3.0)


def test_threads_calling_with_one_model_leave_the_record_in_step():
    """Threads call the same jitted function with the same model at once (the record's lock
    orders the snapshot's check and its update): afterwards the leaves kept are the ones
    the model holds, and the next call equals plain Python's on the model as it is."""
    model = _nnx_model()
    step = tc.jit(_nnx_step, policy="alias")
    x = jnp.ones(3)
    step(model, x), step(model, x)
    errors = []

    def work():
        try:
            for _ in range(10):
                step(model, x)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    kept = step._kept()
    if kept is not None:
        held = {id(leaf) for leaf in kept.leaves}
        assert all(id(leaf) in held for leaf in jax.tree.leaves(model))
    plain = jax.tree.map(np.array, model)  # writable copies
    assert float(step(model, x)) == pytest.approx(float(_nnx_step(plain, x)), rel=1e-5)
    assert _values(model) == pytest.approx(_values(plain), rel=1e-5)


def _shared_step(model, linear, x):
    linear.bias[...] = linear.bias[...] + x
    return _nnx_step(model, x)


def test_an_argument_shared_with_the_kept_ones_is_flattened_with_them(monkeypatch):
    """``step(model, model.linear)``: the second argument is part of the first, so each call
    flattens both together (one object, written once); the record of the model ends at the
    first such call and is not made again for it."""
    flattens = _flattens(monkeypatch)
    model, plain = _nnx_model(), _nnx_model()
    step = tc.jit(_shared_step, policy="alias")
    x = jnp.ones(3)
    for _ in range(6):
        got = step(model, model.linear, x)
        assert float(got) == pytest.approx(float(_shared_step(plain, plain.linear, x)))
    assert _values(model) == pytest.approx(_values(plain))
    assert step._kept() is None
    assert flattens["kept"] <= 1


def test_the_model_is_kept_when_a_new_registered_batch_follows_it(monkeypatch):
    """``step(model, batch)`` with a new batch object (a registered dataclass) at each call:
    the model, met again, is kept; the batch, new, is flattened at each call."""
    flattens = _flattens(monkeypatch)
    model, plain = _nnx_model(), _nnx_model()
    step = tc.jit(lambda m, b: _nnx_step(m, b.x), policy="alias")
    for i in range(5):
        got = step(model, Batch(jnp.full(3, float(i))))
        assert float(got) == pytest.approx(float(_nnx_step(plain, np.full(3, float(i)))))
    assert _values(model) == pytest.approx(_values(plain))
    if WATCHED:
        assert flattens["kept"] == 1 and len(step._kept().args) == 1
