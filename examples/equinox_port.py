"""equinox: a training script ported from eqx.filter_jit / eqx.filter_value_and_grad.

    python examples/equinox_port.py

The script is equinox's idiom: a custom Module holding an ``eqx.nn.MLP``, an activation
function and a name (leaves that are not arrays), an ``eqx.nn.BatchNorm`` whose running
statistics live in an ``eqx.nn.State``, and optax's adamw. Porting it is two replacements:
``eqx.filter_jit`` by ``treeclone.jit(..., traced="arrays")`` and
``eqx.filter_value_and_grad`` by ``treeclone.value_and_grad(..., wrt="arrays")``, equinox's
rule (floating arrays traced and differentiated, everything else static). Under every policy
the losses, the Module and the State equal equinox's own, and the step compiles once.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeclone


class Net(eqx.Module):
    mlp: eqx.nn.MLP
    norm: eqx.nn.BatchNorm
    act: object
    name: str

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(3, 4, 16, 2, activation=jax.nn.tanh, key=key)
        self.norm = eqx.nn.BatchNorm(4, axis_name="batch", mode="batch")
        self.act = jax.nn.softplus
        self.name = "net"

    def __call__(self, x, state):
        h, state = self.norm(self.mlp(x), state)
        return self.act(h)[:2], state


tx = optax.adamw(1e-2)
x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)), jnp.float32)
y = jnp.sin(x[:, :2])


def make_step(jit, value_and_grad):
    """The training step, with the jit and value_and_grad it is written with."""

    def loss_fn(model, state):
        batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        out, state = batched(x, state)
        return jnp.mean((out - y) ** 2), state

    @jit
    def step(model, state, opt_state):
        (loss, state), grads = value_and_grad(loss_fn)(model, state)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, opt_state, loss

    return step


def train(step, steps=5):
    model, state = eqx.nn.make_with_state(Net)(jax.random.key(0))
    opt_state = tx.init(eqx.filter(model, eqx.is_array))
    losses = []
    for _ in range(steps):
        model, state, opt_state, loss = step(model, state, opt_state)
        losses.append(float(loss))
    return model, state, opt_state, losses


def arrays(*trees):
    return jax.tree.leaves(eqx.filter(trees, eqx.is_array))


theirs = train(make_step(eqx.filter_jit, lambda f: eqx.filter_value_and_grad(f, has_aux=True)))
print(f"equinox: loss {theirs[3][0]:.4f} -> {theirs[3][-1]:.4f}")
for policy in ("clone", "alias", "strict"):
    step = make_step(
        lambda f, policy=policy: treeclone.jit(f, policy=policy, traced="arrays"),
        lambda f: treeclone.value_and_grad(f, has_aux=True, wrt="arrays"),
    )
    ours = train(step)
    same = all(
        np.allclose(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(arrays(*ours[:3]), arrays(*theirs[:3]), strict=True)
    ) and np.allclose(ours[3], theirs[3], rtol=1e-5)
    model = ours[0]
    kept = model.act is jax.nn.softplus and model.name == "net"
    print(
        f"{policy}: same as equinox: {same}, static fields kept: {kept}, "
        f"compiled {step._cache_size()} time(s)"
    )
    assert same and kept and step._cache_size() == 1
