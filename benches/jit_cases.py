"""The calls of the jit call-path benchmarks: what is called, and under which contender.

Shared by ``test_jit_bench.py`` (pytest-benchmark) and ``jit_table.py`` (the table in
``docs/benchmarks.md``), so both measure exactly the same calls: an MLP train step with Adam
(dispatch-bound), the identity function over a ~600-leaf transformer+Adam tree (pure call
overhead: flatten, dispatch, rebuild), a step that trains half of the parameters and
returns the other half unchanged, a call that does almost nothing on a small tree (what is
left is dispatch: where clone's own cycle check weighs most), and a trivial function with a
static argument (``static_argnums=1``: the check then looks at the other argument only).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import treeclone

CONTENDERS = ["jax.jit", "clone", "alias", "strict"]
CASES = {
    "mlp_adam_step": "3-layer MLP (32-64-64-10), grad + Adam update, batch 32",
    "identity_600": "identity over params + Adam moments: 576 leaves in 3 x 12 dicts",
    "half_frozen_step": "12 layers x 16 leaves: half returned untouched, half updated",
    "small_dispatch": "sum of one leaf of an 8-layer params dict + Adam state (49 leaves)",
    "static_argnum": "x * n, x a 4-vector, n a static int (static_argnums=1)",
}
OPTIONS = {"static_argnum": {"static_argnums": 1}}  # jit options of a case (default: none)


def wrap(contender, fun, **options):
    """``fun`` jitted by ``contender``: ``jax.jit`` or ``treeclone.jit`` under a policy, with
    the jit ``options``."""
    if contender == "jax.jit":
        return jax.jit(fun, **options)
    return treeclone.jit(fun, policy=contender, **options)


def jitted(contender, case):
    """The function of ``case`` jitted by ``contender``, with the case's options."""
    return wrap(contender, build_case(case)[0], **OPTIONS.get(case, {}))


def _mlp():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    sizes = [(32, 64), (64, 64), (64, 10)]
    params = {
        f"layer{i}": {"w": jax.random.normal(k, s) * 0.1, "b": jnp.zeros(s[1])}
        for i, (k, s) in enumerate(zip(keys, sizes, strict=True))
    }
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    x, y = jnp.ones((32, 32)), jnp.ones((32, 10))

    def loss(p):
        h = x
        for i in range(3):
            h = h @ p[f"layer{i}"]["w"] + p[f"layer{i}"]["b"]
            h = jax.nn.relu(h) if i < 2 else h
        return jnp.mean((h - y) ** 2)

    def step(params, m, v):
        g = jax.grad(loss)(params)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        params = jax.tree.map(lambda p, a, b: p - 1e-3 * a / (jnp.sqrt(b) + 1e-8), params, m, v)
        return params, m, v

    return step, (params, m, v)


def _big_tree():
    layer = {name: jnp.ones((4, 4)) for name in "qkvo"}
    layer.update({f"mlp{i}": jnp.ones((4, 4)) for i in range(12)})
    params = {f"layer{i}": {k: v + i for k, v in layer.items()} for i in range(12)}
    return {
        "params": params,
        "mu": jax.tree.map(jnp.zeros_like, params),
        "nu": jax.tree.map(jnp.zeros_like, params),
    }


def _half_frozen():
    tree = _big_tree()["params"]
    names = sorted(tree)
    frozen = {k: tree[k] for k in names[: len(names) // 2]}
    trained = {k: tree[k] for k in names[len(names) // 2 :]}

    def step(frozen, trained):
        return frozen, jax.tree.map(lambda w: w * 0.99, trained)

    return step, (frozen, trained)


def _small_dispatch():
    params = {f"layer{i}": {"w": jnp.ones((4, 4)), "b": jnp.ones(4)} for i in range(8)}
    moments = {"mu": params, "nu": params, "count": jnp.zeros((), jnp.int32)}
    return (lambda p, opt: p["layer0"]["b"].sum()), (params, moments)


@functools.cache
def build_case(name):
    """``(fun, args)`` of the case ``name`` (built once)."""
    if name == "mlp_adam_step":
        return _mlp()
    if name == "identity_600":
        return (lambda t: t), (_big_tree(),)
    if name == "small_dispatch":
        return _small_dispatch()
    if name == "static_argnum":
        return (lambda x, n: x * n), (jnp.ones(4), 2)
    return _half_frozen()
