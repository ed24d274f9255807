"""flax nnx: a training script ported from nnx.jit / nnx.value_and_grad.

    python examples/nnx_port.py

The model has what makes nnx steps stateful: Dropout (its ``nnx.Rngs`` hold an integer
counter), BatchNorm in training mode, an integer step counter, and a shared Variable (one
``nnx.Linear`` used at two places). The step is nnx's idiom: ``optimizer.update(model,
grads)``, only the loss returned. Porting it is two replacements: ``nnx.jit`` by
``treeclone.jit(..., policy="alias")`` and ``nnx.value_and_grad(loss)`` by
``treeclone.value_and_grad(loss, policy="alias", wrt=nnx.Param)`` (nnx's default ``wrt``).
The losses, every Variable and the optimizer state equal nnx's own; the step compiles once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeclone
from flax import nnx


class Count(nnx.Variable):
    pass


class Model(nnx.Module):
    def __init__(self, rngs):
        self.shared = nnx.Linear(8, 8, rngs=rngs)
        self.encoder = nnx.Linear(3, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)
        self.blocks = nnx.List([self.shared, self.shared])  # one Linear at two places
        self.calls = Count(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.calls[...] += 1
        h = self.drop(jax.nn.relu(self.norm(self.encoder(x))))
        for block in self.blocks:
            h = jax.nn.relu(block(h))
        return self.head(h)


x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)), jnp.float32)
y = jnp.sin(x[:, :2])


def loss_fn(model):
    return jnp.mean((model(x) - y) ** 2)


def make_step(jit, value_and_grad):
    @jit
    def step(model, optimizer):
        loss, grads = value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    return step


def train(step, steps=5):
    model = Model(nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    losses = [float(step(model, optimizer)) for _ in range(steps)]
    return model, optimizer, losses


def leaves(model, optimizer):
    """Every Variable's value as a NumPy array (an RNG key as its data)."""
    values = jax.tree.leaves(nnx.state(model)) + jax.tree.leaves(nnx.state(optimizer))
    return [
        np.asarray(jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v)
        for v in values
    ]


theirs = train(make_step(nnx.jit, nnx.value_and_grad))
print(f"nnx: loss {theirs[2][0]:.4f} -> {theirs[2][-1]:.4f}, calls {int(theirs[0].calls[...])}")
step = make_step(
    lambda f: treeclone.jit(f, policy="alias"),
    lambda f: treeclone.value_and_grad(f, policy="alias", wrt=nnx.Param),
)
ours = train(step)
same = np.allclose(ours[2], theirs[2], rtol=1e-5) and all(
    np.array_equal(a, b) if a.dtype.kind in "iu" else np.allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(leaves(*ours[:2]), leaves(*theirs[:2]), strict=True)
)
model = ours[0]
print(f"alias: same as nnx (losses, every Variable, optimizer state): {same}")
print(f"alias: calls {int(model.calls[...])}, optimizer step {int(ours[1].step[...])}")
print(f"alias: the shared Linear is still one object: {model.blocks[0] is model.blocks[1]}")
print(f"alias: compiled {step._cache_size()} time(s)")
assert same and model.blocks[0] is model.blocks[1] is model.shared and step._cache_size() == 1
