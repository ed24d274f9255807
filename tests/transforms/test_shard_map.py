"""``treeclone.shard_map`` under each policy on 8 CPU devices (docs/semantics.md, "shard_map"):
``clone`` against ``jax.shard_map``; ``alias`` against the plain program on the whole arrays
(no ``shard_map``), with values written into inputs coming back with their input's sharding;
``strict`` against the MutationError.

The scenarios need ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set before JAX is
imported, and the pytest process has imported JAX already: as in ``tests/jit/
test_jit_sharding.py``, a subprocess imports this module and runs ``run_all()``, which runs
every scenario (a function ``sc_*`` that asserts) and reports, per scenario, None or the
failure's traceback; ``test_scenario`` reports each. What needs no devices runs in-process.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import meshes
import numpy as np
import pytest
import treeclone as tc
from helpers import check_answer, run_all_on_cpu_devices
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

NUM_DEVICES = 8
AXIS = "data"
ROWS = 16

SCENARIOS: dict[str, Callable[[], None]] = {}


def scenario(fn: Callable[[], None]) -> Callable[[], None]:
    SCENARIOS[fn.__name__.removeprefix("sc_")] = fn
    return fn


# The kind of mesh the scenarios run on (tests/support/meshes.py), set by run_all.
KIND = "Mesh"


def mesh() -> Mesh:
    assert jax.device_count() == NUM_DEVICES, f"{jax.device_count()} devices, not {NUM_DEVICES}"
    return meshes.make(KIND, (NUM_DEVICES,), (AXIS,))


def put(x: Any, spec: P, m: Mesh | None = None) -> jax.Array:
    return jax.device_put(jnp.asarray(x), NamedSharding(m or mesh(), spec))


def same_sharding(a: jax.Array, b: jax.Array) -> bool:
    return a.sharding == b.sharding or a.sharding.is_equivalent_to(b.sharding, b.ndim)


# --- the data-parallel step ------------------------------------------------------------------

STATE_SPECS = {"mean": P(), "step": P(), "seen": P(AXIS)}
SPECS = (STATE_SPECS, P(AXIS))


def batch(i: int = 0) -> np.ndarray:
    return (np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3) + i) / 10


def make_state() -> dict[str, Any]:
    """Running statistics (replicated), a step counter (replicated) and a per-row record
    (split over the ``data`` axis, as the batch is), placed with their in_specs."""
    return {
        "mean": put(np.zeros(3, np.float32), P()),
        "step": put(np.zeros((), np.int32), P()),
        "seen": put(np.zeros((ROWS, 3), np.float32), P(AXIS)),
    }


def dp_step(state: dict[str, Any], x: jax.Array) -> jax.Array:
    """Per device: its rows of the batch. Updates the running mean with the batch mean
    (``pmean`` over the axis: replicated, as the statistics' in_spec P() says), counts the
    step and records its rows (split, as their in_spec says); returns centred rows."""
    m = jax.lax.pmean(jnp.mean(x, axis=0), AXIS)
    state["mean"] = 0.9 * state["mean"] + 0.1 * m
    state["step"] = state["step"] + 1
    state["seen"] = state["seen"] + x
    return x - m


def dp_step_plain(state: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """The program ``dp_step`` stands for, on the whole arrays, without shard_map."""
    m = np.mean(x, axis=0)
    state["mean"] = np.float32(0.9) * state["mean"] + np.float32(0.1) * m
    state["step"] = state["step"] + 1
    state["seen"] = state["seen"] + x
    return x - m


def plain_state() -> dict[str, Any]:
    return {
        "mean": np.zeros(3, np.float32),
        "step": np.zeros((), np.int32),
        "seen": np.zeros((ROWS, 3), np.float32),
    }


def assert_state_matches(state: dict[str, Any], plain: dict[str, Any], placed: dict) -> None:
    """Values equal the plain program's; each array has the sharding of the input it
    replaced; the caller's dict keeps its keys in its own order."""
    assert list(state) == list(plain), (list(state), list(plain))
    for key, want in plain.items():
        got = state[key]
        assert isinstance(got, jax.Array) and not isinstance(got, jax.core.Tracer), key
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, err_msg=key)
        assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
        assert same_sharding(got, placed[key]), (key, got.sharding, placed[key].sharding)


def run_steps(step: Callable[..., Any], n: int = 3) -> None:
    state = make_state()
    placed = dict(state)
    caller = state
    plain = plain_state()
    for i in range(n):
        x = put(batch(i), P(AXIS))
        out = step(state, x)
        want = dp_step_plain(plain, batch(i))
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
        assert same_sharding(out, x), out.sharding  # out_specs P(AXIS)
        assert state is caller
        assert_state_matches(state, plain, placed)


def sharded(fun: Callable[..., Any], policy: str, **options: Any) -> Callable[..., Any]:
    options = {"mesh": mesh(), "in_specs": SPECS, "out_specs": P(AXIS), **options}
    return tc.shard_map(fun, policy=policy, **options)


@scenario
def sc_alias_data_parallel_step_equals_the_plain_program():
    run_steps(sharded(dp_step, "alias"))


@scenario
def sc_alias_inside_alias_jit_equals_the_plain_program_and_traces_once():
    traces = []

    def counted(state, x):
        traces.append(1)
        return dp_step(state, x)

    run_steps(tc.jit(sharded(counted, "alias"), policy="alias"))
    assert len(traces) == 1, len(traces)


@scenario
def sc_alias_written_back_arrays_keep_a_2d_input_sharding():
    m2 = meshes.make(KIND, (4, 2), ("data", "model"))
    spec = P("data", "model")

    def f(state, x):
        state["w"] = state["w"] * 2 + jax.lax.psum(jnp.sum(x), ("data", "model"))
        return jnp.sum(x, keepdims=True)[None]

    w = np.arange(32, dtype=np.float32).reshape(8, 4)
    x = np.ones((8, 4), np.float32)
    state = {"w": put(w, spec, m2)}
    placed = state["w"]
    g = tc.shard_map(f, mesh=m2, in_specs=({"w": spec}, spec), out_specs=spec, policy="alias")
    with meshes.current(KIND, m2):  # this mesh, not the 1-D one, current where the kind says
        try:  # jax's own shard_map of the same psum, where a release cannot (0.6 on "mixed")
            jax.shard_map(
                lambda x: jax.lax.psum(jnp.sum(x), ("data", "model")),
                mesh=m2,
                in_specs=spec,
                out_specs=P(),
            )(put(x, spec, m2))
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise Skip(f"jax {jax.__version__}'s shard_map refuses this psum: {first}") from None
        for call in (g, tc.jit(g, policy="alias")):
            before = np.asarray(state["w"])
            call(state, put(x, spec, m2))
            np.testing.assert_allclose(np.asarray(state["w"]), before * 2 + 32)
            assert same_sharding(state["w"], placed), state["w"].sharding


@scenario
def sc_clone_is_jax_shard_map_and_leaves_the_caller_untouched():
    def pure(state, x):
        return dp_step(dict(state), x), jax.lax.pmean(jnp.sum(x), AXIS)

    options = {"mesh": mesh(), "in_specs": SPECS, "out_specs": (P(AXIS), P())}
    ours = tc.shard_map(pure, **options)
    theirs = jax.shard_map(pure, **options)
    state, x = make_state(), put(batch(), P(AXIS))
    got, want = ours(state, x), theirs(state, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.sharding == b.sharding
    assert str(jax.make_jaxpr(ours)(state, x)) == str(jax.make_jaxpr(theirs)(state, x))
    # jax.shard_map hands the function a rebuilt dict: its mutation is dropped, under clone too
    state = make_state()
    before = dict(state)
    tc.shard_map(dp_step, mesh=mesh(), in_specs=SPECS, out_specs=P(AXIS))(state, x)
    assert all(state[k] is before[k] for k in before)


@scenario
def sc_alias_returned_state_is_the_callers_object():
    def step(state, x):
        out = dp_step(state, x)
        return state, out

    state = make_state()
    f = sharded(step, "alias", out_specs=(STATE_SPECS, P(AXIS)))
    for call in (f, tc.jit(f, policy="alias")):
        returned, _ = call(state, put(batch(), P(AXIS)))
        assert returned is state
        assert isinstance(state["step"], jax.Array)
    assert int(state["step"]) == 2
    # an input returned unchanged is the caller's own array (rule J7)
    x = put(batch(), P(AXIS))
    same = tc.shard_map(lambda x: x, mesh=mesh(), in_specs=P(AXIS), out_specs=P(AXIS))
    assert same(x) is not x  # clone: jax.shard_map's new array
    with tc.policy("alias"):
        assert same(x) is x


@scenario
def sc_strict_unreturned_mutation_names_the_key_paths_and_returned_is_allowed():
    state = make_state()
    before = dict(state)
    for call in (sharded(dp_step, "strict"), tc.jit(sharded(dp_step, "strict"))):
        try:
            call(state, put(batch(), P(AXIS)))
        except tc.MutationError as err:
            text = str(err)
        else:
            raise AssertionError("no MutationError")
        for path in ("state['mean']", "state['seen']", "state['step']"):
            assert path in text, text
        assert all(state[k] is before[k] for k in before)

    def step(state, x):
        out = dp_step(state, x)
        return state, out

    f = sharded(step, "strict", out_specs=(STATE_SPECS, P(AXIS)))
    new, _ = f(state, put(batch(), P(AXIS)))
    assert new is not state and int(new["step"]) == 1 and int(state["step"]) == 0


@scenario
def sc_varying_value_written_into_a_replicated_input_is_an_error_naming_it():
    def forgot_pmean(state, x):
        state["step"] = state["step"] + 1
        state["mean"] = jnp.mean(x, axis=0)  # this device's rows only: varies over AXIS
        return x

    state = make_state()
    before = dict(state)
    f = sharded(forgot_pmean, "alias")
    for call in (f, tc.jit(f, policy="alias")):
        try:
            call(state, put(batch(), P(AXIS)))
        except ValueError as err:
            text = str(err)
        else:
            raise AssertionError("no ValueError")
        assert text.startswith("state['mean']: "), text
        assert "varies across mesh axis 'data'" in text and f"in_spec {P()} " in text, text
        assert all(state[k] is before[k] for k in before)  # nothing written back
    # check_vma=False: unchecked, as jax.shard_map with check_vma=False
    sharded(forgot_pmean, "alias", check_vma=False)(state, put(batch(), P(AXIS)))
    assert int(state["step"]) == 1 and state["mean"].shape == (3,)


@scenario
def sc_written_value_needs_the_rank_of_its_in_spec():
    def f(state, x):
        state["seen"] = jnp.sum(state["seen"])  # a scalar into an input split by P(AXIS)
        return x

    try:
        sharded(f, "alias")(make_state(), put(batch(), P(AXIS)))
    except ValueError as err:
        assert str(err).startswith("state['seen']: ") and "rank 0" in str(err), str(err)
    else:
        raise AssertionError("no ValueError")


@scenario
def sc_a_value_written_and_returned_with_another_spec_is_an_error():
    def f(state, x):
        state["mean"] = jax.lax.pmean(jnp.mean(x, axis=0), AXIS)
        return state["mean"][None]  # returned as well, concatenated over the axis

    def g(state, x):
        state["mean"] = jax.lax.pmean(jnp.mean(x, axis=0), AXIS)
        return state["mean"]  # the same spec (P()): one array, the caller's

    try:
        sharded(f, "alias", out_specs=P(AXIS))(make_state(), put(batch(), P(AXIS)))
    except ValueError:
        raise AssertionError("a fresh value ([None]) is not the written one") from None
    try:
        sharded(g, "alias", out_specs=P(AXIS))(make_state(), put(batch(), P(AXIS)))
    except ValueError as err:
        assert str(err).startswith("state['mean']: ") and f"out_spec {P(AXIS)}" in str(err)
    else:
        raise AssertionError("no ValueError")
    state = make_state()
    out = sharded(g, "alias", out_specs=P())(state, put(batch(), P(AXIS)))
    assert out is state["mean"], "the returned value is the written one"

    def twice(x):
        y = x * 2
        return y, y

    x = put(batch(), P())
    twice_specs = {"mesh": mesh(), "in_specs": P(), "out_specs": (P(), P(AXIS))}
    first, second = jax.shard_map(twice, **twice_specs)(x)  # two arrays: (16, 3), (128, 3)
    assert first.shape != second.shape
    try:
        tc.shard_map(twice, policy="alias", **twice_specs)(x)
    except ValueError as err:
        assert str(err).startswith("result[0] and result[1]: one array is returned"), err
    else:
        raise AssertionError("no ValueError")
    a, b = tc.shard_map(twice, policy="alias", **{**twice_specs, "out_specs": P()})(x)
    assert a is b


@scenario
def sc_new_entry_under_per_entry_in_specs_is_an_error_and_under_one_spec_is_written():
    def f(state, x):
        state["extra"] = jax.lax.psum(jnp.sum(x), AXIS)
        return x

    try:
        sharded(f, "alias")(make_state(), put(batch(), P(AXIS)))
    except ValueError as err:
        assert str(err).startswith("state['extra']: ") and "no spec" in str(err), str(err)
    else:
        raise AssertionError("no ValueError")
    stats = {"total": put(np.zeros((), np.float32), P())}
    tc.shard_map(f, mesh=mesh(), in_specs=(P(), P(AXIS)), out_specs=P(AXIS), policy="alias")(
        stats, put(batch(), P(AXIS))
    )
    np.testing.assert_allclose(np.asarray(stats["extra"]), batch().sum(), rtol=1e-6)
    assert list(stats) == ["total", "extra"]


@scenario
def sc_one_array_at_two_places_is_one_input():
    def f(a, b):
        return a + b

    x = put(batch(), P(AXIS))
    g = tc.shard_map(f, mesh=mesh(), in_specs=(P(AXIS), P()), out_specs=P(AXIS), policy="alias")
    try:
        g(x, x)
    except ValueError as err:
        assert "a and b are one array" in str(err) and f"({P(AXIS)} and {P()})" in str(err)
    else:
        raise AssertionError("no ValueError")
    h = tc.shard_map(f, mesh=mesh(), in_specs=P(AXIS), out_specs=P(AXIS), policy="alias")
    np.testing.assert_allclose(np.asarray(h(x, x)), 2 * batch(), rtol=1e-6)


@scenario
def sc_jax_errors_about_specs_are_jax_shard_maps_own():
    def f(state, x):
        return x

    bad_in = ({"mean": P(), "step": P(AXIS), "seen": P(AXIS)}, P(AXIS))  # a scalar split
    for in_specs, out_specs in ((bad_in, P(AXIS)), (SPECS, P())):  # out: rows not replicated
        messages = []
        for policy in ("clone", "alias", "strict"):
            try:
                tc.shard_map(f, mesh=mesh(), in_specs=in_specs, out_specs=out_specs, policy=policy)(
                    make_state(), put(batch(), P(AXIS))
                )
            except ValueError as err:
                messages.append(str(err))
            else:
                raise AssertionError(f"{policy}: no error")
        assert messages[0] == messages[1] == messages[2], messages


@scenario
def sc_grad_through_alias_shard_map_equals_jax_and_updates_the_callers_state():
    """A data-parallel loss whose per-device function counts its calls in place; the
    gradient is taken outside the shard_map (inside it, with check_vma, the gradient of a
    replicated input would already be summed over the axis)."""

    def loss(w, stats, x):
        stats["calls"] = stats["calls"] + 1
        return jax.lax.pmean(jnp.mean((x @ w) ** 2), AXIS)

    def pure(w, x):
        return jax.lax.pmean(jnp.mean((x @ w) ** 2), AXIS)

    w = put(np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2), P())
    x = put(batch(), P(AXIS))
    specs = (P(), P(), P(AXIS))
    ours = tc.shard_map(loss, mesh=mesh(), in_specs=specs, out_specs=P(), policy="alias")
    theirs = jax.shard_map(pure, mesh=mesh(), in_specs=(P(), P(AXIS)), out_specs=P())
    stats = {"calls": put(np.zeros((), np.int32), P())}
    vg = tc.value_and_grad(ours, policy="alias")
    for call in (vg, tc.jit(vg, policy="alias")):
        value, g = call(w, stats, x)
        want_value, want_g = jax.value_and_grad(theirs)(w, x)
        np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-5)
        full = jax.value_and_grad(lambda w: jnp.mean((batch() @ w) ** 2))(np.asarray(w))
        np.testing.assert_allclose(np.asarray(g), full[1], rtol=1e-5)
    assert int(stats["calls"]) == 2 and isinstance(stats["calls"], jax.Array)


@scenario
def sc_static_inputs_and_decorator_form():
    @tc.shard_map(mesh=mesh(), in_specs=(P(AXIS), None), out_specs=P(AXIS), policy="alias")
    def scale(x, factor):
        return x * factor

    np.testing.assert_allclose(np.asarray(scale(put(batch(), P(AXIS)), 3.0)), batch() * 3)
    assert scale.__name__ == "scale"

    def note(x, notes):
        notes["last"] = jax.lax.psum(jnp.sum(x), AXIS)  # a traced value into a static input
        return x

    notes = {"last": 0.0}
    g = tc.shard_map(note, mesh=mesh(), in_specs=(P(AXIS), None), out_specs=P(AXIS))
    for policy in ("alias", "strict"):
        try:
            with tc.policy(policy):
                g(put(batch(), P(AXIS)), notes)
        except ValueError as err:
            expected = "notes['last']: " if policy == "alias" else "notes['last']: replaced"
            assert expected in str(err) and (policy == "strict" or "None" in str(err)), err
        else:
            raise AssertionError(f"{policy}: no error")
    assert notes == {"last": 0.0}


@scenario
def sc_alias_random_mutation_programs_equal_plain_python():
    """Random trees of every container kind and random in-place programs (``tests/support/
    mutation_programs.py``) run by the per-device function on the 8-device mesh, with the
    tree replicated (``in_specs=P()``: each device holds the whole tree, and a program writes
    NumPy constants, which inside shard_map are a device's whole block), so plain Python on
    the whole arrays is the reference, and every value written back is replicated as its
    input was. The split case is the data-parallel scenarios'."""
    import profiles
    from hypothesis import given, settings
    from mutation_programs import containers, describe, programs, run_as_alias, run_program, trees

    profiles.load()  # this runs in a subprocess, where tests/conftest.py has not loaded it
    m = mesh()
    replicated = NamedSharding(m, P())

    # 25 examples under ci, scaled with the profile: each compiles a shard_map on 8 devices.
    # The health checks are the profile's: none needs suppressing here (drawing a tree and a
    # program takes milliseconds, and too_slow allows 30 s of drawing without a deadline).
    @settings(max_examples=profiles.max_examples(25), deadline=None)
    @given(trees, programs)
    def check(tree, program):
        def f(t):
            run_program(t, program)

        expected = copy.deepcopy(tree)
        expected_nodes = containers(expected)
        expected_index = {id(n): i for i, n in enumerate(expected_nodes)}
        run_as_alias(expected, program)
        mine = copy.deepcopy(tree)
        mine_nodes = containers(mine)
        tc.shard_map(f, mesh=m, in_specs=P(), out_specs=P(), policy="alias")(mine)
        for leaf in jax.tree.leaves(mine):
            assert not isinstance(leaf, jax.Array) or leaf.sharding == replicated, leaf.sharding
        mine_index = {id(n): i for i, n in enumerate(mine_nodes)}
        for got_node, want_node in zip(mine_nodes, expected_nodes, strict=True):
            got, want = describe(got_node, mine_index), describe(want_node, expected_index)
            assert got == want, (program, got, want)

    check()


@scenario
def sc_alias_nnx_batch_norm_equals_nnx_shard_map():
    """An nnx model whose BatchNorm averages its batch statistics over the axis
    (``axis_name``): ``treeclone.shard_map(alias)``, inside ``treeclone.jit(alias)`` and
    eagerly, gives ``nnx.shard_map``'s outputs and running statistics on a copy of the model,
    on the caller's own Variables, replicated as they were passed; ``strict`` names them."""
    try:
        from flax import nnx
    except ImportError:
        raise Skip("flax is not installed") from None
    from nnx_models import Block

    def make_model() -> Block:
        return Block(3, 4, rngs=nnx.Rngs(0), axis_name=AXIS)

    def forward(model: Any, x: jax.Array) -> jax.Array:
        return model(x)

    options = {"mesh": mesh(), "in_specs": (P(), P(AXIS)), "out_specs": P(AXIS)}
    mine, reference = make_model(), make_model()
    variables = list(jax.tree.leaves(mine, is_leaf=lambda v: isinstance(v, nnx.Variable)))
    ours = tc.shard_map(forward, policy="alias", **options)
    for i, call in enumerate((tc.jit(ours, policy="alias"), ours, tc.jit(ours, policy="alias"))):
        x = put(batch(i), P(AXIS))
        want = nnx.shard_map(forward, **options)(reference, x)
        np.testing.assert_allclose(np.asarray(call(mine, x)), np.asarray(want), rtol=1e-5)
    after = list(jax.tree.leaves(mine, is_leaf=lambda v: isinstance(v, nnx.Variable)))
    assert all(a is b for a, b in zip(after, variables, strict=True))
    assert not np.allclose(np.asarray(mine.bn.mean[...]), 0.0), "statistics not updated"
    for a, b in zip(
        jax.tree.leaves(nnx.state(mine)), jax.tree.leaves(nnx.state(reference)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    assert mine.bn.mean[...].sharding.is_equivalent_to(NamedSharding(mesh(), P()), 1)
    try:
        tc.shard_map(forward, policy="strict", **options)(mine, put(batch(), P(AXIS)))
    except tc.MutationError as err:
        assert "model.bn.mean" in str(err) and "model.bn.var" in str(err), err
    else:
        raise AssertionError("strict: no MutationError")


class Skip(Exception):
    """A scenario that cannot run here (its library is not installed)."""


# Every scenario runs on ``Mesh`` (jax.sharding.Mesh, Auto axes); these, whose values written
# back keep their input's placement (eagerly and inside treeclone.jit), on every other kind of
# mesh too (CI time grows with each case).
EVERY_KIND = (
    "alias_data_parallel_step_equals_the_plain_program",
    "alias_inside_alias_jit_equals_the_plain_program_and_traces_once",
    "alias_written_back_arrays_keep_a_2d_input_sharding",
    "alias_returned_state_is_the_callers_object",
)


def cases() -> list[str]:
    """``scenario`` (on ``Mesh``) or ``scenario-kind``."""
    return [
        name if kind == "Mesh" else f"{name}-{kind}"
        for kind in meshes.KINDS
        for name in SCENARIOS
        if kind == "Mesh" or name in EVERY_KIND
    ]


def run_all() -> dict[str, str | None]:
    """``{case: None, "SKIP: why" or the failure}``."""
    global KIND
    results: dict[str, str | None] = {}
    for case in cases():
        name, _, KIND = case.partition("-")
        KIND = KIND or "Mesh"
        why = meshes.unavailable(KIND)
        if why is not None:
            results[case] = f"SKIP: {why}"
            continue
        try:
            with meshes.current(KIND, mesh()):
                SCENARIOS[name]()
        except Skip as why:
            results[case] = f"SKIP: {why}"
        except Exception:  # noqa: BLE001 - reported by the test of that scenario
            results[case] = traceback.format_exc()
        else:
            results[case] = None
    return results


# --- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    return run_all_on_cpu_devices(__file__, NUM_DEVICES)


@pytest.mark.parametrize("name", cases())
def test_scenario(results: dict[str, str | None], name: str) -> None:
    check_answer(results[name])


def test_signature_is_jax_shard_maps_plus_policy() -> None:
    import inspect

    ours = inspect.signature(tc.shard_map).parameters
    theirs = inspect.signature(jax.shard_map).parameters
    # All keyword-only but f (their order: jax's), with treeclone's policy and traced.
    assert set(ours) == {*theirs, "policy", "traced"}
    for name, param in theirs.items():
        assert ours[name].kind == param.kind and ours[name].default == param.default, name
    assert ours["policy"].kind == inspect.Parameter.KEYWORD_ONLY
    assert ours["traced"].kind == inspect.Parameter.KEYWORD_ONLY


def test_alias_and_strict_need_in_specs() -> None:
    m = Mesh(np.array(jax.devices()[:1]), (AXIS,))
    for policy in ("alias", "strict"):
        f = tc.shard_map(lambda x: x, mesh=m, out_specs=P(), policy=policy)
        with pytest.raises(TypeError, match="needs in_specs"):
            f(jnp.zeros(2))
    # with tc.policy(...) overriding a clone wrapper, the same
    f = tc.shard_map(lambda x: x, mesh=m, out_specs=P())
    with tc.policy("alias"), pytest.raises(TypeError, match="needs in_specs"):
        f(jnp.zeros(2))


def test_policy_block_overrides_the_shard_map_policy() -> None:
    m = Mesh(np.array(jax.devices()[:1]), (AXIS,))

    def f(state):
        state["n"] = state["n"] + 1

    g = tc.shard_map(f, mesh=m, in_specs=P(), out_specs=P())
    state = {"n": jnp.zeros(())}
    g(state)
    assert float(state["n"]) == 0.0
    with tc.policy("alias"):
        g(state)
    assert float(state["n"]) == 1.0


def test_keyword_arguments_and_bad_function_are_jax_errors() -> None:
    m = Mesh(np.array(jax.devices()[:1]), (AXIS,))
    for policy in ("clone", "alias"):
        f = tc.shard_map(lambda x: x, mesh=m, in_specs=P(), out_specs=P(), policy=policy)
        with pytest.raises(TypeError):
            f(x=jnp.zeros(2))
    with pytest.raises(TypeError, match="callable"):
        tc.shard_map(3, mesh=m, in_specs=P(), out_specs=P(), policy="alias")  # type: ignore


def test_cycle_in_arguments_is_the_value_error_of_every_policy() -> None:
    m = Mesh(np.array(jax.devices()[:1]), (AXIS,))
    cyclic: list[Any] = [jnp.zeros(2)]
    cyclic.append(cyclic)
    for policy in ("clone", "alias", "strict"):
        f = tc.shard_map(lambda x: x, mesh=m, in_specs=P(), out_specs=P(), policy=policy)
        with pytest.raises(ValueError, match="cycle"):
            f(cyclic)
