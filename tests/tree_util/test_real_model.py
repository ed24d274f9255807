"""A small real model written against the ``jax.tree_util`` API, trained once with JAX's module
and once with treeclone's substituted. The parameters must come out bit-for-bit identical."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
import treeclone.tree_util as tc


@jtu.register_dataclass
@dataclasses.dataclass
class AdamState:
    """Optimizer state; ``step`` is data, the hyper-parameters are static metadata."""

    step: Any
    mu: Any
    nu: Any
    b1: float = dataclasses.field(default=0.9, metadata={"static": True})
    b2: float = dataclasses.field(default=0.999, metadata={"static": True})


class Batch(NamedTuple):
    x: Any
    y: Any


def init_mlp(key: jax.Array, sizes: list[int]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    keys = jax.random.split(key, len(sizes) - 1)
    for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True)):
        wk, _ = jax.random.split(k)
        params[f"layer{i}"] = {
            "w": jax.random.normal(wk, (n_in, n_out)) / jnp.sqrt(n_in),
            "b": jnp.zeros((n_out,)),
        }
    params["scale"] = (jnp.ones(()), None)  # a tuple with a None node inside the params tree
    return params


def forward(tu: Any, params: dict[str, Any], x: jax.Array) -> jax.Array:
    n_layers = sum(1 for k in params if k.startswith("layer"))
    for i in range(n_layers):
        layer = params[f"layer{i}"]
        x = x @ layer["w"] + layer["b"]
        if i < n_layers - 1:
            x = jnp.tanh(x)
    return x * params["scale"][0]


def loss_fn(tu: Any, params: dict[str, Any], batch: Batch) -> jax.Array:
    pred = forward(tu, params, batch.x)
    mse = jnp.mean((pred - batch.y) ** 2)
    # L2 on weight matrices only, selected by key path (exercises paths and keystr)
    l2 = tu.tree_reduce(
        lambda acc, v: acc + v,
        tu.tree_map_with_path(
            lambda path, p: jnp.sum(p**2) if tu.keystr(path).endswith("['w']") else 0.0,
            params,
        ),
        0.0,
    )
    return mse + 1e-3 * l2


def adam_init(tu: Any, params: dict[str, Any]) -> AdamState:
    zeros = tu.tree_map(jnp.zeros_like, params)
    return AdamState(
        step=jnp.zeros((), jnp.int32), mu=zeros, nu=tu.tree_map(jnp.zeros_like, params)
    )


def adam_update(
    tu: Any, grads: Any, state: AdamState, params: Any, lr: float = 1e-2
) -> tuple[Any, AdamState]:
    step = state.step + 1
    mu = tu.tree_map(lambda m, g: state.b1 * m + (1 - state.b1) * g, state.mu, grads)
    nu = tu.tree_map(lambda v, g: state.b2 * v + (1 - state.b2) * g * g, state.nu, grads)
    t = step.astype(jnp.float32)
    mu_hat_scale = 1 / (1 - state.b1**t)
    nu_hat_scale = 1 / (1 - state.b2**t)

    def apply(p: Any, m: Any, v: Any) -> Any:
        return p - lr * (m * mu_hat_scale) / (jnp.sqrt(v * nu_hat_scale) + 1e-8)

    new_params = tu.tree_map(apply, params, mu, nu)
    # clip through an explicit flatten / unflatten round trip
    leaves, treedef = tu.tree_flatten(new_params)
    leaves = [jnp.clip(leaf, -5.0, 5.0) for leaf in leaves]
    new_params = tu.tree_unflatten(treedef, leaves)
    return new_params, dataclasses.replace(state, step=step, mu=mu, nu=nu)


def train(tu: Any, *, use_jit: bool, steps: int = 8) -> tuple[Any, AdamState, list[float]]:
    key = jax.random.PRNGKey(0)
    pkey, xkey = jax.random.split(key)
    params = init_mlp(pkey, [3, 16, 8, 1])
    x = jax.random.normal(xkey, (32, 3))
    batch = Batch(x=x, y=jnp.sin(x.sum(axis=1, keepdims=True)))
    state = adam_init(tu, params)

    def step_fn(params: Any, state: AdamState, batch: Batch) -> tuple[Any, AdamState, Any]:
        loss, grads = jax.value_and_grad(lambda p: loss_fn(tu, p, batch))(params)
        assert tu.tree_structure(grads) == tu.tree_structure(params)
        params, state = adam_update(tu, grads, state, params)
        return params, state, loss

    if use_jit:
        step_fn = jax.jit(step_fn)
    losses = []
    for _ in range(steps):
        params, state, loss = step_fn(params, state, batch)
        losses.append(float(loss))
    return params, state, losses


@pytest.mark.parametrize("use_jit", [False, True], ids=["eager", "jit"])
def test_training_with_treeclone_gives_identical_parameters(use_jit):
    jax_params, jax_state, jax_losses = train(jtu, use_jit=use_jit)
    tc_params, tc_state, tc_losses = train(tc, use_jit=use_jit)

    assert jax_losses[-1] < jax_losses[0], "the model did not train; the test would be vacuous"
    assert tc_losses == jax_losses
    assert jtu.tree_structure(tc_params) == jtu.tree_structure(jax_params)
    assert jtu.tree_structure(tc_state) == jtu.tree_structure(jax_state)
    for (path, a), b in zip(
        jtu.tree_leaves_with_path((tc_params, tc_state)),
        jtu.tree_leaves((jax_params, jax_state)),
        strict=True,
    ):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, jtu.keystr(path)
        assert np.array_equal(a, b), f"{jtu.keystr(path)} differs"


def test_parameter_bookkeeping_matches_jax():
    params = init_mlp(jax.random.PRNGKey(1), [4, 5, 2])
    state = adam_init(tc, params)
    tc_paths = [tc.keystr(p) for p, _ in tc.tree_leaves_with_path((params, state))]
    jax_paths = [jtu.keystr(p) for p, _ in jtu.tree_leaves_with_path((params, state))]
    assert tc_paths == jax_paths
    assert tc.tree_structure(state).to_jax() == jtu.tree_structure(state)
    n_params = tc.tree_reduce(lambda acc, p: acc + p.size, params, 0)
    assert n_params == sum(p.size for p in jtu.tree_leaves(params)) == 4 * 5 + 5 + 5 * 2 + 2 + 1
