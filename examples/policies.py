"""The three policies on the seed's pattern: a training step whose optimizer updates itself
in place and is not returned.

    python examples/policies.py

Plain Python and ``treeclone.jit(policy="alias")`` update the caller's model and optimizer;
``jax.jit`` and ``policy="clone"`` (the default) silently lose the update; ``policy="strict"``
refuses the step with a ``MutationError`` naming every input it changed.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import treeclone


@jax.tree_util.register_pytree_node_class
class Optimizer:
    """SGD with momentum whose ``update`` changes the optimizer itself."""

    def __init__(self, lr, momentum, count):
        self.lr = lr  # static: not a leaf
        self.momentum = momentum
        self.count = count

    def tree_flatten(self):
        return (self.momentum, self.count), self.lr

    @classmethod
    def tree_unflatten(cls, lr, children):
        return cls(lr, *children)

    def update(self, grads, params):
        self.momentum = jax.tree.map(lambda m, g: 0.9 * m + g, self.momentum, grads)
        self.count = self.count + 1
        return jax.tree.map(lambda p, m: p - self.lr * m, params, self.momentum)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
    params: dict


def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w"] + params["b"]) - y) ** 2)


def train_step(model, x, y, optimizer):
    """Updates ``model`` and ``optimizer`` in place; returns only the loss."""
    loss, grads = jax.value_and_grad(loss_fn)(model.params, x, y)
    model.params = optimizer.update(grads, model.params)
    return loss


def fresh():
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.zeros(2)}
    model = Model(params)
    optimizer = Optimizer(0.1, jax.tree.map(jnp.zeros_like, params), jnp.asarray(0))
    return model, optimizer


x = jnp.ones((4, 3))
y = jnp.zeros((4, 2))

# Plain Python, no jit: the reference.
model, optimizer = fresh()
train_step(model, x, y, optimizer)
expected_w = model.params["w"]
print(f"plain Python: optimizer.count = {int(optimizer.count)} (updated in place)")

# jax.jit: the function runs on rebuilt copies, so the in-place update never reaches the caller.
model, optimizer = fresh()
jax.jit(train_step)(model, x, y, optimizer)
print(f"jax.jit:      optimizer.count = {int(optimizer.count)} (update lost)")

# clone, the default policy, is exactly jax.jit.
model, optimizer = fresh()
treeclone.jit(train_step)(model, x, y, optimizer)
print(f"clone:        optimizer.count = {int(optimizer.count)} (update lost, as under jax.jit)")

# alias: the step behaves as it does without jit, on the caller's own objects.
model, optimizer = fresh()
step = treeclone.jit(train_step, policy="alias")
step(model, x, y, optimizer)
same = bool(np.allclose(model.params["w"], expected_w, atol=1e-6))
print(f"alias:        optimizer.count = {int(optimizer.count)}, plain Python's parameters: {same}")
assert same
step(model, x, y, optimizer)
step(model, x, y, optimizer)
print(f"alias:        optimizer.count = {int(optimizer.count)} after 3 steps")

# strict: relying on an in-place mutation that is not returned is an error, raised at trace
# time, before anything reaches the caller.
model, optimizer = fresh()
try:
    treeclone.jit(train_step, policy="strict")(model, x, y, optimizer)
except treeclone.MutationError as e:
    print(f"strict:       MutationError: {e}")
else:
    raise AssertionError("strict accepted a step that mutates its inputs without returning them")
print(f"strict:       optimizer.count = {int(optimizer.count)} (caller untouched)")


# strict accepts the same step once it returns what it changes (and then behaves as clone).
def train_step_returning(model, x, y, optimizer):
    loss = train_step(model, x, y, optimizer)
    return model, optimizer, loss


model, optimizer = fresh()
model, optimizer, loss = treeclone.jit(train_step_returning, policy="strict")(
    model, x, y, optimizer
)
print(f"strict, returned: optimizer.count = {int(optimizer.count)}")

# A block of code can override every jitted function's policy (per call:
# jitted.with_policy("alias")(...)).
model, optimizer = fresh()
with treeclone.policy("alias"):
    treeclone.jit(train_step)(model, x, y, optimizer)  # the block overrides the default
print(f"with treeclone.policy('alias'): optimizer.count = {int(optimizer.count)}")
