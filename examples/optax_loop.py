"""optax: a params dict and an optax state under ``policy="alias"``.

    python examples/optax_loop.py

1. The standard functional optax loop runs unchanged under ``treeclone.jit`` with any policy
   and gives ``jax.jit``'s results.
2. Under ``alias`` the same step can instead update a ``state`` dict in place and return only
   the loss: the caller's dict (and the ``params`` dict inside it) are updated, as in plain
   Python. optax states are tuples and namedtuples, which cannot change in place; the step
   assigns the new one into the dict that holds it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeclone

tx = optax.adam(1e-2)


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def init_params():
    rng = np.random.default_rng(0)
    return {
        "w1": jnp.asarray(rng.normal(size=(3, 16)) / 3, jnp.float32),
        "b1": jnp.zeros(16),
        "w2": jnp.asarray(rng.normal(size=(16, 2)) / 4, jnp.float32),
    }


x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 3)), jnp.float32)
y = jnp.sin(x[:, :2])


# 1. The standard loop: (params, opt_state) in, (params, opt_state, loss) out.
def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def run(jit):
    params = init_params()
    opt_state = tx.init(params)
    f = jit(step)
    for _ in range(5):
        params, opt_state, loss = f(params, opt_state, x, y)
    return params, opt_state, loss


ref_params, ref_opt_state, ref_loss = run(jax.jit)
for policy in ("clone", "alias", "strict"):
    params, opt_state, loss = run(lambda f, p=policy: treeclone.jit(f, policy=p))
    same = all(
        np.allclose(a, b, rtol=1e-4, atol=1e-6)
        for a, b in zip(
            jax.tree.leaves((params, opt_state, loss)),
            jax.tree.leaves((ref_params, ref_opt_state, ref_loss)),
            strict=True,
        )
    )
    print(f"functional loop, {policy}: same as jax.jit: {same}")
    assert same


# 2. In place under alias: the step changes `state` and returns only the loss.
def step_in_place(state, x, y):
    params = state["params"]
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state["opt_state"] = tx.update(grads, state["opt_state"], params)
    params.update(optax.apply_updates(params, updates))  # the caller's params dict, in place
    return loss


params = init_params()
state = {"params": params, "opt_state": tx.init(params)}
train = treeclone.jit(step_in_place, policy="alias")
for _ in range(5):
    loss = train(state, x, y)
same = all(
    np.allclose(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(
        jax.tree.leaves((state["params"], state["opt_state"], loss)),
        jax.tree.leaves((ref_params, ref_opt_state, ref_loss)),
        strict=True,
    )
)
print(f"in-place loop, alias: same as jax.jit's functional loop: {same}")
print(f"in-place loop, alias: the caller's params dict, updated: {state['params'] is params}")
print(f"in-place loop, alias: adam step count = {int(state['opt_state'][0].count)}")
assert same and state["params"] is params
