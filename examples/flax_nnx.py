"""flax nnx: a Module and an nnx.Optimizer updated in place under ``policy="alias"``.

    python examples/flax_nnx.py

The training step is nnx's own idiom: it calls ``optimizer.update(model, grads)`` and returns
nothing. Under ``treeclone.jit(step, policy="alias")`` the caller's model and optimizer are
updated, as under ``nnx.jit``, and the two give the same parameters and optimizer state.
Under ``jax.jit`` the same step silently changes nothing.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeclone
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(3, 16, rngs=rngs)
        self.out = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


traces = 0


def step(model, optimizer, x, y):
    global traces
    traces += 1  # runs once per trace, not once per call
    grads = nnx.grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)  # changes model and optimizer in place; nothing returned


def make():
    model = MLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def state_leaves(model, optimizer):
    return jax.tree.leaves(nnx.state(model)) + jax.tree.leaves(nnx.state(optimizer))


x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
y = jnp.sin(x[:, :2])

# treeclone.jit, policy "alias".
model, optimizer = make()
kernel = model.hidden.kernel  # an nnx.Variable of the caller's model
initial_loss = float(loss_fn(model, x, y))
tc_step = treeclone.jit(step, policy="alias")
for _ in range(5):
    tc_step(model, optimizer, x, y)
print(f"alias: loss {initial_loss:.4f} -> {float(loss_fn(model, x, y)):.4f} after 5 steps")
print(f"alias: optimizer.step = {int(optimizer.step[...])}, traced {traces} time(s)")
print(f"alias: model.hidden.kernel is the same Variable: {model.hidden.kernel is kernel}")

# nnx.jit, the same step: the reference.
ref_model, ref_optimizer = make()
nnx_step = nnx.jit(step)
for _ in range(5):
    nnx_step(ref_model, ref_optimizer, x, y)
same = all(
    np.allclose(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(
        state_leaves(model, optimizer), state_leaves(ref_model, ref_optimizer), strict=True
    )
)
print(f"alias == nnx.jit (parameters and optimizer state): {same}")
assert same

# jax.jit: the step runs on rebuilt copies of the Module and the Optimizer; the update is lost.
model, optimizer = make()
jax.jit(step)(model, optimizer, x, y)
print(f"jax.jit: optimizer.step = {int(optimizer.step[...])} (update lost)")
