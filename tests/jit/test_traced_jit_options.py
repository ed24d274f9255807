"""``traced=`` with the rest of jit's interface: ``in_shardings`` (a sharding given for an
argument applies to its traced leaves; the static ones have none) and ``jit_partial``, which
takes jit's keywords, each against ``eqx.filter_jit`` under every policy.

docs/semantics.md, "Leaves that are not arrays: ``traced=``"."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from helpers import run_script

eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")

from eqx_models import NamedMLP  # noqa: E402 - after the skips

# jit_partial's policies (clone keeps no identity: jit_partial refuses it).
POLICIES = ["alias", "strict", {"model": "alias", "opt_state": "alias", "x": "strict"}]

# On 8 CPU devices (a fresh process: XLA_FLAGS must be set before JAX starts).
_SHARDED = """
import equinox as eqx, jax, jax.numpy as jnp, numpy as np, treeclone as tc
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("data",))
model = eqx.nn.MLP(4, 2, 8, 1, activation=jnp.tanh, key=jax.random.key(0))
x = jnp.arange(32.0).reshape(8, 4) / 10
rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

def step(model, state, x):
    state["n"] = state["n"] + 1
    return jax.vmap(model)(x), x * 2, state

want = eqx.filter_jit(lambda m, x: (jax.vmap(m)(x), x * 2))(model, jax.device_put(x, rows))
for policy in ["clone", "alias", "strict", {"model": "alias", "state": "alias", "x": "strict"}]:
    state = {"n": jnp.zeros((), jnp.int32), "tag": "run"}
    # Per argument: the Module's arrays replicated, its activation and the string static.
    f = tc.jit(step, policy=policy, traced="arrays", in_shardings=(whole, whole, rows))
    out, doubled, _ = f(model, state, x)
    np.testing.assert_allclose(out, want[0], rtol=1e-6)
    np.testing.assert_allclose(doubled, want[1])
    assert doubled.sharding.is_equivalent_to(rows, 2), (policy, doubled.sharding)
    assert state["tag"] == "run"
    # One sharding for every argument, as jax.jit reads it: each traced leaf's.
    one = policy if isinstance(policy, str) else "alias"
    g = tc.jit(lambda m, x: jax.vmap(m)(x).sum(), policy=one, traced="arrays", in_shardings=whole)
    np.testing.assert_allclose(g(model, x), want[0].sum(), rtol=1e-6)
"""


def test_in_shardings_apply_to_the_traced_leaves_of_their_argument() -> None:
    run_script(_SHARDED, prelude=False, timeout=600, cpu_devices=8)


_OPT = optax.adam(1e-2)


def _step(model: NamedMLP, opt_state: Any, x: jax.Array) -> tuple[jax.Array, NamedMLP, Any]:
    def loss(m: NamedMLP) -> jax.Array:
        return jnp.mean(jax.vmap(m)(x) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    updates, opt_state = _OPT.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return value, eqx.apply_updates(model, updates), opt_state


@pytest.mark.parametrize("policy", POLICIES)
def test_jit_partial_with_traced_binds_a_module_and_equals_filter_jit(policy: Any) -> None:
    """A Module (with its activation and a string) and its optimizer state bound once, the
    batch given at each call: ``eqx.filter_jit``'s losses and Module, step after step."""
    model = NamedMLP(eqx.nn.MLP(3, 2, 8, 1, activation=jnp.tanh, key=jax.random.key(1)), "net")
    opt_state = _OPT.init(eqx.filter(model, eqx.is_array))
    xs = jax.random.normal(jax.random.key(2), (3, 4, 3))
    theirs = eqx.filter_jit(_step)
    want_model, want_state, want_losses = model, opt_state, []
    for x in xs:
        loss, want_model, want_state = theirs(want_model, want_state, x)
        want_losses.append(float(loss))
    bound_model, bound_state = model, opt_state
    p = tc.jit_partial(_step, bound_model, bound_state, policy=policy, traced="arrays")
    for x, want_loss in zip(xs, want_losses, strict=True):
        loss, new_model, new_state = p(x)
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
        p = tc.jit_partial(_step, new_model, new_state, policy=policy, traced="arrays")
    for a, b in zip(jax.tree.leaves(new_model), jax.tree.leaves(want_model), strict=True):
        if eqx.is_array(b):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert a is b or a == b
    assert new_model.mlp.activation is jnp.tanh and new_model.name == "net"
