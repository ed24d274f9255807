"""equinox: Modules with non-array leaves (activation functions) under treeclone.jit.

    python examples/equinox_modules.py

An ``eqx.nn.MLP`` holds its activation functions as pytree leaves. ``treeclone.jit``, under
every policy, treats them as ``jax.jit`` does: passing the whole Module is a ``TypeError``
naming the leaf (``model.activation``). With ``traced="arrays"`` (equinox's rule: arrays are
traced, every other leaf is static, as under ``eqx.filter_jit``) the whole Module is an
argument and the step written for ``eqx.filter_jit`` runs unchanged, giving its results under
every policy, tracing once. Without it, split the Module with ``eqx.partition`` into its
arrays (traced) and the rest (a hashable static argument), and ``eqx.combine`` them inside
the step. ``treeclone.vmap`` and ``treeclone.checkpoint`` take the same rule: an ensemble
built and run with them, and its gradient through a checkpoint, equal ``eqx.filter_vmap``'s
and ``eqx.filter_checkpoint``'s; ``treeclone.scan(..., traced="arrays")`` accumulates gradients
over micro-batches with the Module in its carry, as ``eqx.partition`` around ``jax.lax.scan``.
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeclone

tx = optax.adam(1e-2)
model = eqx.nn.MLP(3, 2, 16, 2, key=jax.random.PRNGKey(0))
x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
y = jnp.sin(x[:, :2])

non_arrays = [type(leaf).__name__ for leaf in jax.tree.leaves(model) if not eqx.is_array(leaf)]
print(f"non-array leaves of the MLP: {non_arrays}")


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


# The whole Module as an argument: the same TypeError as jax.jit's, under every policy.
for name, jit in [("jax.jit", jax.jit)] + [
    (p, lambda f, p=p: treeclone.jit(f, policy=p)) for p in ("clone", "alias", "strict")
]:
    try:
        jit(loss_fn)(model, x, y)
    except TypeError as e:
        path = re.search(r"at path (\S+?)\.?$", str(e), re.M).group(1)
        print(f"{name}: TypeError: a {type(model.activation).__name__} passed at path {path}")
        assert path == "model.activation"


# Partition instead: arrays are traced, everything else is a static argument.
params, static = eqx.partition(model, eqx.is_array)
traces = 0


def step(params, static, opt_state, x, y):
    global traces
    traces += 1
    loss, grads = jax.value_and_grad(lambda p: loss_fn(eqx.combine(p, static), x, y))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return eqx.apply_updates(params, updates), opt_state, loss


# The reference: equinox's own filter_jit on the whole Module.
@eqx.filter_jit
def eqx_step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


ref_model, ref_opt_state = model, tx.init(params)
for _ in range(5):
    ref_model, ref_opt_state, ref_loss = eqx_step(ref_model, ref_opt_state, x, y)

for policy in ("clone", "alias", "strict"):
    traces = 0
    train = treeclone.jit(step, policy=policy, static_argnums=1)
    p, opt_state = params, tx.init(params)
    for _ in range(5):
        p, opt_state, loss = train(p, static, opt_state, x, y)
    trained = eqx.combine(p, static)  # a whole Module again
    same = all(
        np.allclose(a, b, rtol=1e-4, atol=1e-6)
        for a, b in zip(
            jax.tree.leaves(eqx.filter((trained, opt_state, loss), eqx.is_array)),
            jax.tree.leaves(eqx.filter((ref_model, ref_opt_state, ref_loss), eqx.is_array)),
            strict=True,
        )
    )
    print(f"partitioned loop, {policy}: same as eqx.filter_jit: {same}, traced {traces} time(s)")
    assert same and traces == 1


# Or pass the whole Module, with equinox's rule: eqx_step's own function, unchanged.
for policy in ("clone", "alias", "strict"):
    train = treeclone.jit(eqx_step.__wrapped__, policy=policy, traced="arrays")
    m, opt_state = model, tx.init(params)
    for _ in range(5):
        m, opt_state, loss = train(m, opt_state, x, y)
    same = all(
        np.allclose(a, b, rtol=1e-4, atol=1e-6)
        for a, b in zip(
            jax.tree.leaves(eqx.filter((m, opt_state, loss), eqx.is_array)),
            jax.tree.leaves(eqx.filter((ref_model, ref_opt_state, ref_loss), eqx.is_array)),
            strict=True,
        )
    )
    kept = m.activation is model.activation
    print(f"traced='arrays', {policy}: same as eqx.filter_jit: {same}, activation kept: {kept}")
    assert same and kept


# An ensemble, as equinox builds one: eqx.filter_vmap over the constructor, then over the
# ensemble's forward pass (each member's activation functions stay static, unmapped);
# treeclone.vmap(..., traced="arrays") is the same, and so is treeclone.checkpoint with it
# (eqx.filter_checkpoint) inside a gradient.
def make(key):
    return eqx.nn.MLP(3, 2, 16, 2, key=key)


keys = jax.random.split(jax.random.PRNGKey(1), 4)
ref_ensemble = eqx.filter_vmap(make)(keys)
ref_out = eqx.filter_vmap(lambda m, x: jax.vmap(m)(x), in_axes=(eqx.if_array(0), None))(
    ref_ensemble, x
)


def ensemble_loss(ensemble, x, y, lift):
    out = lift(lambda m, x: jax.vmap(m)(x))(ensemble, x)  # (members, batch, 2)
    return jnp.mean((out - y) ** 2)


def eqx_lift(f):
    return eqx.filter_vmap(eqx.filter_checkpoint(f), in_axes=(eqx.if_array(0), None))


ref_grads = eqx.filter_grad(ensemble_loss)(ref_ensemble, x, y, eqx_lift)
for policy in ("clone", "alias", "strict"):
    ensemble = treeclone.vmap(make, policy=policy, traced="arrays")(keys)
    out = treeclone.vmap(
        lambda m, x: jax.vmap(m)(x), in_axes=(0, None), policy=policy, traced="arrays"
    )(ensemble, x)

    def lifted(f, policy=policy):
        checkpointed = treeclone.checkpoint(f, policy=policy, traced="arrays")
        return treeclone.vmap(checkpointed, in_axes=(0, None), policy=policy, traced="arrays")

    grads = treeclone.grad(ensemble_loss, wrt="arrays")(ensemble, x, y, lifted)
    same = (
        np.allclose(out, ref_out, rtol=1e-5, atol=1e-6)
        and all(
            np.allclose(a, b, rtol=1e-5, atol=1e-6)
            for a, b in zip(jax.tree.leaves(ensemble), jax.tree.leaves(ref_ensemble), strict=True)
            if eqx.is_array(a)
        )
        and all(
            np.allclose(a, b, rtol=1e-4, atol=1e-6)
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True)
        )
    )
    kept = ensemble.activation is ref_ensemble.activation
    print(
        f"ensemble, {policy}: same as eqx.filter_vmap / filter_checkpoint: {same}, "
        f"activation kept: {kept}"
    )
    assert same and kept

# Gradient accumulation over micro-batches: a scan whose carry holds the Module and the summed
# gradients. treeclone.scan(..., traced="arrays") carries the whole Module (its activation a
# constant of the loop); equinox's idiom splits it with eqx.partition around jax.lax.scan.
micro_x, micro_y = x.reshape(4, 2, 3), y.reshape(4, 2, 2)


def accumulate(carry, batch):
    model, total = carry
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, *batch)
    return (model, jax.tree.map(jnp.add, total, grads)), loss


zeros = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_array))
dynamic, static = eqx.partition((model, zeros), eqx.is_array)


def eqx_accumulate(carry, batch):
    new, loss = accumulate(eqx.combine(carry, static), batch)
    return eqx.partition(new, eqx.is_array)[0], loss


ref_carry, ref_losses = jax.lax.scan(eqx_accumulate, dynamic, (micro_x, micro_y))
ref_total = eqx.combine(ref_carry, static)[1]
(kept, total), losses = treeclone.scan(
    accumulate, (model, zeros), (micro_x, micro_y), traced="arrays"
)
assert kept.activation is model.activation and np.allclose(losses, ref_losses, rtol=1e-5)
for policy in ("clone", "alias", "strict"):
    (kept_model, total), losses = treeclone.scan(
        accumulate, (model, zeros), (micro_x, micro_y), policy=policy, traced="arrays"
    )
    same = np.allclose(losses, ref_losses, rtol=1e-5) and all(
        np.allclose(a, b, rtol=1e-5, atol=1e-7)
        for a, b in zip(jax.tree.leaves(total), jax.tree.leaves(ref_total), strict=True)
    )
    kept = kept_model.activation is model.activation
    print(f"scan, {policy}: same as eqx.partition around jax.lax.scan: {same}, kept: {kept}")
    assert same and kept
