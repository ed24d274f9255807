"""Sharding conformance of ``treeclone.jit`` with ``jax.jit`` on 8 CPU devices (issue 4).

The scenarios need ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set before JAX is
imported, and the pytest process has imported JAX already: a subprocess imports this module
and runs ``run_all()``, which compares every scenario under ``treeclone.jit`` (each policy)
with ``jax.jit`` as ``test_jit_conformance`` does (values, dtypes, weak types, structure,
exception types, trace counts) and also compares the ``.sharding`` of every output array.
Inputs are placed with ``jax.device_put(x, sharding)``. The pytest side reports the problems
found for each (scenario, policy).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run_script
from test_jit_conformance import POLICIES, Run, assert_conforms, run

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable:UserWarning")

NUM_DEVICES = 8
MARKER = "SHARDING-RESULTS:"

# --- the scenarios (run in the subprocess) --------------------------------------------------------


class Env:
    """The meshes and shardings, built in the subprocess on first use."""

    _instance: Env | None = None

    def __init__(self) -> None:
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        devices = np.array(jax.devices())
        assert devices.size == NUM_DEVICES, f"{devices.size} devices, expected {NUM_DEVICES}"
        self.mesh = Mesh(devices, ("x",))
        self.S = NamedSharding(self.mesh, P("x"))  # split over the 8 devices
        self.R = NamedSharding(self.mesh, P())  # replicated
        self.mesh2 = Mesh(devices.reshape(4, 2), ("x", "y"))
        self.S2 = NamedSharding(self.mesh2, P("x", "y"))
        self.T2 = NamedSharding(self.mesh2, P("y", None))

    @classmethod
    def get(cls) -> Env:
        if cls._instance is None:
            cls._instance = Env()
        return cls._instance


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


def run_all() -> dict[str, dict[str, str | None]]:
    """``{scenario: {policy: problem or None}}``."""
    results: dict[str, dict[str, str | None]] = {}
    for name, sc in SCENARIOS.items():
        expected = run(sc, "jax")
        results[name] = {policy: check(run(sc, policy), expected) for policy in POLICIES}
    return results


# --- the tests --------------------------------------------------------------------------------

_SCRIPT = f"""
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={NUM_DEVICES}"
import json
import warnings
warnings.simplefilter("ignore")
import test_jit_sharding
print({MARKER!r} + json.dumps(test_jit_sharding.run_all()))
"""


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, str | None]]:
    stdout = run_script(_SCRIPT, prelude=False, timeout=600, path=[os.path.dirname(__file__)])
    line = next(line for line in stdout.splitlines() if line.startswith(MARKER))
    return json.loads(line[len(MARKER) :])


def _cases():
    for name in SCENARIOS:
        for policy in POLICIES:
            reason = KNOWN.get((name, policy))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(name, policy, id=f"{name}-{policy}", marks=marks)


@pytest.mark.parametrize(("name", "policy"), list(_cases()))
def test_sharding_conforms(results: dict, name: str, policy: str) -> None:
    problem = results[name][policy]
    assert problem is None, problem
