"""Real library code with ``jax.tree_util`` and ``jax.tree`` replaced by treeclone's.

Each case trains a few steps of a small model with optax, equinox or flax nnx, once as
shipped and once with every public function of ``jax.tree_util`` and ``jax.tree`` replaced by
treeclone's (``treeclone.tree_util`` or ``treeclone.jaxlib_tree_util``, and ``treeclone.tree``),
and compares the losses and final parameters bit for bit. The libraries call these functions
through the module attribute (``jtu.tree_map``, ``jax.tree.map``), so the replacement reaches
their internals, traced and untraced.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
import treeclone.jaxlib_tree_util as jl
import treeclone.tree as ttree
import treeclone.tree_util as tc

Run = tuple[list[float], list[np.ndarray]]


def _optax_adamw() -> Run:
    optax = pytest.importorskip("optax")
    key = jax.random.PRNGKey(0)
    params = {"w": jax.random.normal(key, (4, 2)), "b": jnp.zeros(2), "extra": [jnp.ones(3)]}
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
    state = opt.init(params)
    x, y = jnp.ones((8, 4)), jnp.ones((8, 2))

    @jax.jit
    def step(params, state):
        def loss(p):
            return jnp.mean((x @ p["w"] + p["b"] - y) ** 2) + jnp.sum(p["extra"][0] ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for _ in range(3):
        params, state, value = step(params, state)
        losses.append(float(value))
    return losses, [np.asarray(a) for a in jtu.tree_leaves((params, state))]


def _equinox_mlp() -> Run:
    eqx = pytest.importorskip("equinox")
    optax = pytest.importorskip("optax")
    model = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.PRNGKey(0))
    opt = optax.adam(1e-2)
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    x, y = jnp.ones((16, 4)), jnp.zeros((16, 2))

    @eqx.filter_jit
    def step(model, state):
        def loss(m):
            return jnp.mean((jax.vmap(m)(x) - y) ** 2)

        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state, value

    losses = []
    for _ in range(3):
        model, state, value = step(model, state)
        losses.append(float(value))
    return losses, [np.asarray(a) for a in jtu.tree_leaves(eqx.filter(model, eqx.is_array))]


def _flax_nnx() -> Run:
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")
    from nnx_models import Headed

    model = Headed(4, 8, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x, y = jnp.ones((16, 4)), jnp.zeros((16, 2))

    @nnx.jit
    def step(model, optimizer):
        def loss(m):
            return jnp.mean((m(x) - y) ** 2)

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    losses = [float(step(model, optimizer)) for _ in range(3)]
    state = nnx.state((model, optimizer))
    return losses, [np.asarray(a) for a in jtu.tree_leaves(state)]


CASES: dict[str, Callable[[], Run]] = {
    "optax": _optax_adamw,
    "equinox": _equinox_mlp,
    "flax_nnx": _flax_nnx,
}


@pytest.mark.parametrize("namespace", [tc, jl], ids=["tree_util", "jaxlib_tree_util"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_library_gives_identical_results_with_treeclone_tree_functions(
    monkeypatch, case, namespace
):
    expected = CASES[case]()
    calls: list[str] = []

    def counted(name: str, function: Callable) -> Callable:
        if not callable(function) or isinstance(function, type):
            return function  # classes (key types, Partial) are the same objects anyway

        def call(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)

        return call

    for name in namespace.__all__:
        if name != "PyTreeDef":  # jax's own code checks treedefs against jaxlib's type
            monkeypatch.setattr(jtu, name, counted(name, getattr(namespace, name)))
    for name in (n for n in dir(jax.tree) if not n.startswith("_")):
        monkeypatch.setattr(jax.tree, name, counted(f"tree.{name}", getattr(ttree, name)))
    got = CASES[case]()
    assert len(calls) > 10, f"the library barely reached treeclone: {calls}"
    assert got[0] == expected[0]
    assert len(got[1]) == len(expected[1])
    for a, b in zip(got[1], expected[1], strict=True):
        np.testing.assert_array_equal(a, b)
