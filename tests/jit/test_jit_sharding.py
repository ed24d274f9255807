"""Sharding conformance of ``treeclone.jit`` with ``jax.jit`` on 8 CPU devices (issue 4).

The scenarios need ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set before JAX is
imported, and the pytest process has imported JAX already: a subprocess imports this module
and runs ``run_all()``, which compares every scenario under ``treeclone.jit`` (each policy)
with ``jax.jit`` as ``test_jit_conformance`` does (values, dtypes, weak types, structure,
exception types, trace counts) and also compares the ``.sharding`` of every output array.
Inputs are placed with ``jax.device_put(x, sharding)``. Each scenario runs on the kinds of
mesh JAX makes (``tests/support/meshes.py``; ``ON_KIND`` says which where, issue 57), jax.jit
on the same kind the reference. The pytest side reports the problems found for each
(scenario, policy, mesh kind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import meshes
import numpy as np
import pytest
from helpers import check_answer, run_all_on_cpu_devices
from test_jit_conformance import POLICIES, Run, assert_conforms, run

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable:UserWarning")

NUM_DEVICES = 8

# --- the scenarios (run in the subprocess) --------------------------------------------------------


class Env:
    """The meshes and shardings of one mesh kind (``tests/support/meshes.py``; the kind being
    run: ``Env.kind``), built in the subprocess on first use."""

    kind = "Mesh"
    _instances: dict[str, Env] = {}

    def __init__(self, kind: str) -> None:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        assert jax.device_count() == NUM_DEVICES, f"{jax.device_count()} devices"
        self.mesh = meshes.make(kind, (NUM_DEVICES,), ("x",))
        self.S = NamedSharding(self.mesh, P("x"))  # split over the 8 devices
        self.R = NamedSharding(self.mesh, P())  # replicated
        self.mesh2 = meshes.make(kind, (4, 2), ("x", "y"))
        self.S2 = NamedSharding(self.mesh2, P("x", "y"))
        self.T2 = NamedSharding(self.mesh2, P("y", None))

    @classmethod
    def get(cls) -> Env:
        if cls.kind not in cls._instances:
            cls._instances[cls.kind] = Env(cls.kind)
        return cls._instances[cls.kind]


def placed(sharding: Any, n: int = 16, offset: float = 0.0) -> jax.Array:
    return jax.device_put(jnp.arange(n, dtype=jnp.float32) + offset, sharding)


SCENARIOS: dict[str, Callable[..., Any]] = {}
KNOWN: dict[tuple[str, str], str] = {}


def scenario(*, known: dict[str, str] | None = None):
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = fn.__name__.removeprefix("sc_")
        SCENARIOS[name] = fn
        KNOWN.update({(name, policy): reason for policy, reason in (known or {}).items()})
        return fn

    return register


@scenario()
def sc_in_and_out(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return a + b, a * 2

    g = jit(f, in_shardings=(e.S, e.S), out_shardings=(e.S, e.R))
    return [g(placed(e.S), placed(e.S, offset=1.0)), g(placed(e.S), placed(e.S))]


@scenario()
def sc_out_shardings_on_returned_inputs(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return a, b, a - b

    g = jit(f, in_shardings=(e.S, e.S), out_shardings=(e.R, e.S, e.R))
    return g(placed(e.S), placed(e.S, offset=1.0))


@scenario()
def sc_returned_inputs_without_out_shardings(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return {"a": a, "b": b, "sum": a + b}

    return jit(f, in_shardings=(e.S, e.S))(placed(e.S), placed(e.S))


@scenario()
def sc_out_shardings_prefix(jit, count):
    e = Env.get()

    def f(a):
        count()
        return (a * 2, [a + 1, a.sum(), 1.0, np.ones(4)])

    return jit(f, out_shardings=e.R)(placed(e.S))


@scenario()
def sc_out_shardings_dict(jit, count):
    e = Env.get()

    def f(a):
        count()
        return {"k": a * 2, "m": a + 1, "n": None}

    return jit(f, out_shardings={"k": e.R, "m": e.S, "n": None})(placed(e.S))


@scenario()
def sc_single_in_sharding_for_all(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return a * b

    return jit(f, in_shardings=e.S, out_shardings=e.S)(placed(e.S), placed(e.S))


@scenario()
def sc_static_with_in_shardings(jit, count):
    e = Env.get()

    def f(k, a):
        count()
        return a * k

    g = jit(f, static_argnums=0, in_shardings=(e.S,), out_shardings=e.S)
    return [g(3, placed(e.S)), g(3, placed(e.S)), g(4, placed(e.S))]


@scenario()
def sc_pytree_in_shardings(jit, count):
    e = Env.get()

    def f(d, c):
        count()
        return {"sum": d["a"] + d["b"], "c": c * 2}

    g = jit(f, in_shardings=({"a": e.S, "b": e.R}, e.S), out_shardings={"sum": e.S, "c": e.R})
    return g({"a": placed(e.S), "b": placed(e.R)}, placed(e.S))


@scenario()
def sc_unspecified_in_sharding(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return a + b

    return jit(f, in_shardings=(e.S, None))(placed(e.S), placed(e.S))


@scenario()
def sc_mesh_2d(jit, count):
    e = Env.get()

    def f(a):
        count()
        return a @ a.T, a * 2

    a = jax.device_put(jnp.arange(32.0).reshape(8, 4), e.S2)
    g = jit(f, in_shardings=e.S2, out_shardings=(e.T2, e.S2))
    return [g(a), g(a)]


@scenario()
def sc_retrace_counts(jit, count):
    e = Env.get()

    def f(a):
        count()
        return a * 2

    g = jit(f, in_shardings=e.S, out_shardings=e.R)
    return [g(placed(e.S)), g(placed(e.S)), g(placed(e.S, n=32)), g(placed(e.S))]


@scenario()
def sc_no_shardings_given(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return a * b, a.sum()

    return jit(f)(placed(e.S), placed(e.S))


@scenario()
def sc_donation(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return a * 2 + b

    a, b = placed(e.S), placed(e.S)
    out = jit(f, in_shardings=(e.S, e.S), out_shardings=e.S, donate_argnums=0)(a, b)
    return [out, a.is_deleted(), b.is_deleted()]


@scenario()
def sc_grad(jit, count):
    e = Env.get()

    def loss(w, x):
        count()
        return jnp.sum(jnp.tanh(w * x) ** 2)

    g = jax.grad(jit(loss, in_shardings=(e.S, e.S), out_shardings=e.R))
    return [g(placed(e.S, offset=0.5), placed(e.S)), g(placed(e.S), placed(e.S))]


@scenario()
def sc_vmap(jit, count):
    e = Env.get()

    def f(a, b):
        count()
        return a * b

    g = jax.vmap(jit(f, out_shardings=e.S), in_axes=(None, 0))
    return g(placed(e.S), jnp.arange(3.0))


@scenario()
def sc_uncommitted_input_returned(jit, count):
    e = Env.get()

    def f(a):
        count()
        return a

    return jit(f, in_shardings=e.S)(jnp.arange(16.0))


@scenario()
def sc_uncommitted_input_computed(jit, count):
    e = Env.get()

    def f(a):
        count()
        return a * 2

    return jit(f, in_shardings=e.S)(jnp.arange(16.0))


@scenario()
def sc_mismatched_committed_input(jit, count):
    e = Env.get()

    def f(a):
        count()
        return a * 2

    return jit(f, in_shardings=e.R)(placed(e.S))


# --- comparing (in the subprocess) ---------------------------------------------------------------


def assert_same_shardings(actual: Any, expected: Any) -> None:
    a_leaves = jax.tree_util.tree_leaves(actual)
    e_leaves = jax.tree_util.tree_leaves(expected)
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        if not isinstance(e, jax.Array):
            continue
        same = a.sharding == e.sharding or a.sharding.is_equivalent_to(e.sharding, e.ndim)
        assert same, f"leaf {i}: sharding {a.sharding} != jax.jit's {e.sharding}"


def check(actual: Run, expected: Run) -> str | None:
    """None when ``actual`` conforms to ``expected``, else what differs."""
    try:
        assert_conforms(actual, expected)
        if expected.error is None:
            assert_same_shardings(actual.value, expected.value)
    except AssertionError as exc:
        return str(exc)
    return None


# The mesh kinds the scenarios run on (CI time grows with each case): every scenario on
# ``Mesh`` (jax.sharding.Mesh, Auto axes) and ``explicit`` (jax.make_mesh's default); the ones
# that place arguments and results, uncommitted ones too, with an Explicit mesh made current
# and on a mixed one; the three that place both on a 1-D and a 2-D mesh on a make_mesh with
# Auto axes and on a Mesh made current (jax.set_mesh, ``with mesh:``).
PLACING = ("in_and_out", "pytree_in_shardings", "mesh_2d")
SOME_SCENARIOS = (
    *PLACING,
    "out_shardings_on_returned_inputs",
    "out_shardings_prefix",
    "uncommitted_input_computed",
    "donation",
)
ON_KIND: dict[str, tuple[str, ...] | None] = {  # None: every scenario
    "Mesh": None,
    "explicit": None,
    "explicit+set_mesh": SOME_SCENARIOS,
    "mixed": SOME_SCENARIOS,
    "auto": PLACING,
    "Mesh+set_mesh": PLACING,
    "Mesh+with": PLACING,
}


def kinds_of(name: str) -> list[str]:
    return [k for k in meshes.KINDS if ON_KIND[k] is None or name in ON_KIND[k]]


def run_all() -> dict[str, dict[str, str | None]]:
    """``{scenario-kind: {policy: problem or None}}`` (``SKIP: why`` for a kind the installed
    JAX cannot make)."""
    results: dict[str, dict[str, str | None]] = {}
    for kind in meshes.KINDS:
        why = meshes.unavailable(kind)
        Env.kind = kind
        for name, sc in SCENARIOS.items():
            if kind not in kinds_of(name):
                continue
            if why is not None:
                results[f"{name}-{kind}"] = dict.fromkeys(POLICIES, f"SKIP: {why}")
                continue
            with meshes.current(kind, Env.get().mesh):
                expected = run(sc, "jax")
                results[f"{name}-{kind}"] = {
                    policy: check(run(sc, policy), expected) for policy in POLICIES
                }
    return results


# --- the tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, str | None]]:
    return run_all_on_cpu_devices(__file__, NUM_DEVICES)


def _cases():
    for name in SCENARIOS:
        for kind in kinds_of(name):
            for policy in POLICIES:
                reason = KNOWN.get((name, policy))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                yield pytest.param(name, policy, kind, id=f"{name}-{policy}-{kind}", marks=marks)


@pytest.mark.parametrize(("name", "policy", "kind"), list(_cases()))
def test_sharding_conforms(results: dict, name: str, policy: str, kind: str) -> None:
    check_answer(results[f"{name}-{kind}"][policy])


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_one_array_given_two_in_shardings_names_in_shardings_and_the_arguments(
    policy: str,
) -> None:
    """One array passed at two places that in_shardings places differently (under alias and
    strict one object, as in plain Python): a ValueError naming in_shardings and both places
    by the user's argument names and key paths, before anything is written back."""
    import treeclone as tc
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    split, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())

    def step(params: dict, opt: dict) -> None:
        params["w"] = params["w"] + opt["m"]

    x = jnp.zeros(4)
    params, opt = {"w": x}, {"m": x}
    jitted = tc.jit(step, policy=policy, in_shardings=({"w": split}, {"m": whole}))
    with pytest.raises(ValueError) as info:
        jitted(params, opt)
    text = str(info.value)
    assert text.startswith("params['w'] and opt['m'] are one array, which in_shardings places"), (
        text
    )
    assert "out_shardings" not in text, text
    assert params["w"] is x and opt["m"] is x
