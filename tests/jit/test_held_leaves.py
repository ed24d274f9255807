"""A leaf the computation outputs in place of the caller's is written into the custom node that
holds it (docs/semantics.md, rule J7): under ``alias``, an input array returned as it came is the
caller's own, except when it was donated, resharded by ``in_shardings`` or placed by
``out_shardings``: then the computation produces it, and the caller's container that holds it
gets it. A dict's entry always did; a custom node written back by its changed attributes (an
nnx Variable, a registered dataclass) now does too, where it kept the old array (a donated one,
deleted; one not placed as asked).

flax's own ``tests/nnx/transforms_test.py::TestJIT::test_apply_shardings`` is the case that
found it: ``nnx.jit(in_shardings=(nnx.StateSharding(...),), graph=True, graph_updates=True)``
on an ``nnx.Linear`` with an empty body must leave ``m.kernel`` a ``NamedSharding``; with
nnx's ``jax.jit`` replaced by ``treeclone.jit(policy="alias")`` the kernel kept its
``SingleDeviceSharding``. Checked against nnx on ``jax.jit``, on 8 CPU devices in a
subprocess (``XLA_FLAGS`` must be set before JAX is imported)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from helpers import printed_json, run_script

nnx = pytest.importorskip("flax.nnx")

MARKER = "HELD-LEAVES:"

_SCRIPT = f"""
import json
import jax
import numpy as np
import treeclone as tc
from flax import nnx
import flax.nnx.transforms.compilation as compilation
from jax.experimental import mesh_utils


class JaxWithTreecloneJit:
    # The jax nnx's jit module sees: its jax.jit(f, ...) calls treeclone.jit(f, policy=...).
    def __init__(self, policy):
        self.policy = policy

    def jit(self, fun=None, **options):
        return tc.jit(fun, policy=self.policy, **options)

    def __getattr__(self, name):
        return getattr(jax, name)


def apply_shardings():
    # flax's TestJIT.test_apply_shardings, returning what it checks.
    n = max(jax.local_device_count() // 2, 1)
    devices = mesh_utils.create_device_mesh((n, jax.local_device_count() // n))
    mesh = jax.sharding.Mesh(devices, ("a", "b"))

    def sharding(*args):
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*args))

    state_sharding = nnx.StateSharding(
        {{
            nnx.PathContains("kernel"): sharding("a", "b"),
            nnx.PathContains("bias"): sharding("b"),
        }}
    )
    m = nnx.Linear(16, 32, rngs=nnx.Rngs(0))
    kernel = np.asarray(m.kernel[...])
    assert not isinstance(m.kernel.sharding, jax.sharding.NamedSharding)

    @nnx.jit(in_shardings=(state_sharding,), graph=True, graph_updates=True)
    def constrain_object(m):
        pass

    constrain_object(m)
    np.testing.assert_array_equal(np.asarray(m.kernel[...]), kernel)
    return [str(m.kernel.sharding), str(m.bias.sharding)]


found = {{"jax.jit": apply_shardings()}}
for policy in ("alias", "strict"):
    compilation.jax = JaxWithTreecloneJit(policy)
    found[policy] = apply_shardings()
print({MARKER!r} + json.dumps(found))
"""


def test_nnx_jit_in_shardings_on_treeclone_jit_place_the_model_as_on_jax_jit() -> None:
    stdout = run_script(_SCRIPT, prelude=False, timeout=300, cpu_devices=8)
    found = printed_json(stdout, MARKER)
    assert "NamedSharding" in found["jax.jit"][0]
    assert found["alias"] == found["jax.jit"]
    assert found["strict"] == found["jax.jit"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Box:
    """A custom node written back by its attributes."""

    value: jax.Array


def _param_state() -> dict:
    return {"k": nnx.Param(jnp.arange(3.0)), "n": nnx.Param(jnp.ones(3))}


def _box_state() -> dict:
    return {"k": Box(jnp.arange(3.0)), "n": Box(jnp.ones(3))}


def _read(node: object) -> jax.Array:
    return node[...] if isinstance(node, nnx.Variable) else node.value  # type: ignore[attr-defined]


def _step(state: dict) -> dict:
    if isinstance(state["n"], nnx.Variable):
        state["n"][...] = state["n"][...] + 1
    else:
        state["n"].value = state["n"].value + 1
    return state  # state["k"] as it came


@pytest.mark.parametrize("make", [_param_state, _box_state], ids=["nnx.Param", "dataclass"])
@pytest.mark.parametrize("how", ["jit", "jit_partial"])
def test_a_donated_custom_node_returned_as_it_came_holds_the_computed_array(make, how: str) -> None:
    """Donated and returned as it came, ``state["k"]``'s array is deleted by the call (as
    under jax.jit); the caller's node must hold the array the computation output in its place
    (as plain Python would leave it: the same values), not the deleted one, at every call.
    Under jax.jit the returned state holds new arrays with those values."""
    expected = make()
    for _ in range(2):
        expected = jax.jit(_step, donate_argnums=0)(expected)
    state = make()
    old = _read(state["k"])
    if how == "jit":
        step = tc.jit(_step, policy="alias", donate_argnums=0)
        outs = [step(state) for _ in range(2)]
    else:
        step = tc.jit_partial(_step, state, policy="alias", donate_argnums=0)
        outs = [step() for _ in range(2)]
    assert all(out is state for out in outs)
    assert old.is_deleted()
    for key in ("k", "n"):
        assert not _read(state[key]).is_deleted()
        np.testing.assert_array_equal(np.asarray(_read(state[key])), _read(expected[key]))
