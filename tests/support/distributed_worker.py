"""One process of the two-process data-parallel test (``tests/distributed``); not a test.

Run as ``python distributed_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR [HOST]`` with
``JAX_PLATFORMS=cpu`` and ``XLA_FLAGS=--xla_force_host_platform_device_count=DEVICES_PER_PROCESS``
(the test sets both). The process joins a JAX multi-controller run through
``jax.distributed.initialize`` (coordinator on HOST:PORT, a loopback: 127.0.0.1 unless the
test found only ``[::1]``, started by process 0), builds
the same model state as every other process, places the global batch over a ``data`` axis
of a mesh of all global devices (each process supplies its own rows), and runs each
*scenario* below: ``STEPS`` training steps with a step function that updates its state dict
in place. Each scenario checks what it can inside the process (the caller's dict kept and
updated, a policy's error) and returns its final state; the process writes every scenario's
parameters, momentum, step and losses to ``OUT_DIR/process{ID}.npz`` as NumPy arrays, and the
test compares the processes with each other and with ``reference()``, the same steps under
plain ``jax.jit`` in a single process.

Adding a scenario is one more function registered in ``SCENARIOS``: the test reads that dict
and checks every scenario in it (``alias_shard_map`` is ``treeclone.shard_map``'s).

Importing this module does nothing distributed: the model, the data and the step function
are shared with the test, which computes the single-process reference from them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

STEPS = 3
LEARNING_RATE = 0.1
MOMENTUM = 0.9
SIZES = (6, 16, 16, 3)  # input, hidden, hidden, output
GLOBAL_BATCH = 32  # rows; split evenly over every global device
AXIS = "data"
MODEL = "model"  # the second axis of the 2-D mesh

# --- model, data, step (shared with the test) ---------------------------------------------------


def init_state() -> dict[str, Any]:
    """The training state every process (and the reference) starts from: NumPy leaves.

    A dict (params: a list of per-layer dicts, momentum: the same structure, step: a scalar),
    deterministic, so every process builds the same one without communicating.
    """
    rng = np.random.default_rng(0)
    params = [
        {
            "w": (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32),
            "b": (0.1 * rng.standard_normal((n_out,))).astype(np.float32),
        }
        for n_in, n_out in zip(SIZES[:-1], SIZES[1:], strict=True)
    ]
    momentum = [{k: np.zeros_like(v) for k, v in layer.items()} for layer in params]
    return {"params": params, "momentum": momentum, "step": np.int32(0)}


def global_batch() -> tuple[np.ndarray, np.ndarray]:
    """The global batch (inputs, targets); every process builds all of it and keeps its rows."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((GLOBAL_BATCH, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((GLOBAL_BATCH, SIZES[-1])).astype(np.float32)
    return x, y


def loss_fn(params: list[dict[str, jax.Array]], x: jax.Array, y: jax.Array) -> jax.Array:
    h = x
    for i, layer in enumerate(params):
        h = h @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


def train_step(state: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    """SGD with momentum that updates ``state`` in place and returns only the loss.

    The loss is a mean over the global batch, so with the batch split over the ``data`` axis
    XLA all-reduces the gradients across both processes.
    """
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
    apply_update(state, grads)
    return loss


def apply_update(state: dict[str, Any], grads: list[dict[str, jax.Array]]) -> None:
    """The momentum-SGD update, written into ``state`` in place."""
    state["momentum"] = jax.tree.map(lambda m, g: MOMENTUM * m + g, state["momentum"], grads)
    state["params"] = jax.tree.map(
        lambda p, m: p - LEARNING_RATE * m, state["params"], state["momentum"]
    )
    state["step"] = state["step"] + 1


def train_step_returning(state: dict[str, Any], x: jax.Array, y: jax.Array):
    """``train_step`` that also returns the state it mutated (allowed under every policy)."""
    loss = train_step(state, x, y)
    return state, loss


def reference() -> dict[str, Any]:
    """The single-process result: ``STEPS`` steps of ``train_step`` under plain ``jax.jit``.

    ``jax.jit`` drops the in-place update (the caller's dict is not touched), so the step
    returns the state it mutated and the loop rebinds it. Leaves come back as NumPy arrays,
    losses as a list of floats.
    """
    x, y = global_batch()
    state = jax.tree.map(jnp.asarray, init_state())
    step = jax.jit(train_step_returning)
    losses = []
    for _ in range(STEPS):
        state, loss = step(state, x, y)
        losses.append(float(loss))
    return {**jax.tree.map(np.asarray, state), "losses": losses}


# --- the distributed side -----------------------------------------------------------------------


class Setup:
    """The global mesh, the shardings and the placed batch of this process.

    ``two_d``: a ``data x model`` mesh, one row of devices per process (the batch split over
    the processes, replicated over ``model``), where the first layer's weights and their
    momentum are split over ``model`` (``P(None, "model")``) and the rest replicated; else a
    1-D ``data`` mesh of every device, the whole state replicated."""

    def __init__(self, two_d: bool = False) -> None:
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        devices = np.array(jax.devices())
        if two_d:
            self.mesh = Mesh(devices.reshape(jax.process_count(), -1), (AXIS, MODEL))
        else:
            self.mesh = Mesh(devices, (AXIS,))
        self.batch_sharding = NamedSharding(self.mesh, P(AXIS))
        self.replicated = NamedSharding(self.mesh, P())
        self.split = NamedSharding(self.mesh, P(None, MODEL)) if two_d else self.replicated
        x, y = global_batch()
        self.x = self.place_batch(x)
        self.y = self.place_batch(y)

    def place_batch(self, array: np.ndarray) -> jax.Array:
        """Each process supplies only its own rows (those its devices hold)."""
        rows = GLOBAL_BATCH // jax.process_count()
        start = jax.process_index() * rows
        local = array[start : start + rows]
        placed = jax.make_array_from_process_local_data(self.batch_sharding, local, array.shape)
        assert not placed.is_fully_addressable, "the batch should span both processes"
        return placed

    def place_state(self) -> dict[str, Any]:
        """``init_state()`` placed over every global device: replicated, but for the first
        layer's weights and their momentum on a 2-D mesh (``self.split``)."""

        def place(path: tuple, leaf: np.ndarray) -> jax.Array:
            leaf = np.asarray(leaf)
            first_weights = jax.tree_util.keystr(path).endswith("[0]['w']")
            sharding = self.split if first_weights else self.replicated
            return jax.make_array_from_callback(leaf.shape, sharding, lambda idx: leaf[idx])

        return jax.tree_util.tree_map_with_path(place, init_state())


def fetch(tree: Any) -> Any:
    """Global values of a tree of (possibly non-fully-addressable) arrays, as NumPy arrays."""
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def alias_jit(setup: Setup) -> dict[str, Any]:
    """``treeclone.jit(train_step, policy="alias")``: the step's in-place update of the
    caller's dict is kept, as without jit; the loop never rebinds ``state``."""
    import treeclone

    state = setup.place_state()
    initial = fetch(state["params"])
    step = treeclone.jit(train_step, policy="alias")
    losses = []
    for i in range(STEPS):
        loss = step(state, setup.x, setup.y)
        losses.append(float(fetch(loss)))
        # What the caller holds is its own dict, updated by the step as plain Python would.
        assert int(fetch(state["step"])) == i + 1, f"step {i}: the caller's step not advanced"
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), fetch(state["params"]), initial)
    assert all(jax.tree.leaves(moved)), "alias: the caller's params were not updated"
    return {**fetch(state), "losses": losses}


def alias_jit_returning(setup: Setup) -> dict[str, Any]:
    """The same under ``alias`` with the state returned: it is the caller's dict itself."""
    import treeclone

    state = setup.place_state()
    step = treeclone.jit(train_step_returning, policy="alias")
    losses = []
    for _ in range(STEPS):
        returned, loss = step(state, setup.x, setup.y)
        assert returned is state, "alias: a returned input must be the caller's object"
        losses.append(float(fetch(loss)))
    return {**fetch(state), "losses": losses}


def clone_jit(setup: Setup) -> dict[str, Any]:
    """``clone`` is ``jax.jit``: the caller's dict is left as it was, the returned state is a
    fresh dict, and the loop rebinds it."""
    import treeclone

    state = setup.place_state()
    step = treeclone.jit(train_step_returning, policy="clone")
    losses = []
    for _ in range(STEPS):
        before = state
        state, loss = step(before, setup.x, setup.y)
        assert state is not before, "clone: the returned state must be a fresh dict"
        assert int(fetch(before["step"])) == len(losses), "clone: the caller's dict changed"
        losses.append(float(fetch(loss)))
    return {**fetch(state), "losses": losses}


def strict_jit(setup: Setup) -> dict[str, Any]:
    """``strict``: the unreturned in-place update is a MutationError (raised at trace time,
    the same in both processes, before anything runs); the returning step trains."""
    import treeclone

    state = setup.place_state()
    try:
        treeclone.jit(train_step, policy="strict")(state, setup.x, setup.y)
    except treeclone.MutationError:
        pass
    else:
        raise AssertionError("strict: an unreturned mutation of the state did not raise")
    assert int(fetch(state["step"])) == 0, "strict: the caller's dict changed"
    step = treeclone.jit(train_step_returning, policy="strict")
    losses = []
    for _ in range(STEPS):
        state, loss = step(state, setup.x, setup.y)
        losses.append(float(fetch(loss)))
    return {**fetch(state), "losses": losses}


def alias_jit_of_shard_map(setup: Setup) -> dict[str, Any]:
    """``alias`` around a step whose loss is a ``jax.shard_map``: each device computes its
    shard's loss and ``pmean`` averages it over the ``data`` axis (over both processes),
    explicitly where ``train_step`` leaves the reduction to XLA; the gradient is taken
    outside the ``shard_map`` and the update written into the caller's dict in place.

    (Taking ``value_and_grad`` inside the ``shard_map`` and ``pmean``-ing the gradients would
    be wrong by a factor of the axis size: with ``check_vma`` the gradient of a replicated
    input is already summed over the axis, under plain ``jax.jit`` too.)
    """
    import treeclone
    from jax.sharding import PartitionSpec as P

    def shard_loss(params, x, y):
        return jax.lax.pmean(loss_fn(params, x, y), AXIS)

    global_loss = jax.shard_map(
        shard_loss, mesh=setup.mesh, in_specs=(P(), P(AXIS), P(AXIS)), out_specs=P()
    )

    def step_fn(state, x, y):
        loss, grads = jax.value_and_grad(global_loss)(state["params"], x, y)
        apply_update(state, grads)
        return loss

    state = setup.place_state()
    step = treeclone.jit(step_fn, policy="alias")
    losses = []
    for i in range(STEPS):
        losses.append(float(fetch(step(state, setup.x, setup.y))))
        assert int(fetch(state["step"])) == i + 1, f"step {i}: the caller's step not advanced"
    return {**fetch(state), "losses": losses}


def alias_shard_map(setup: Setup) -> dict[str, Any]:
    """``treeclone.jit(alias)`` over ``treeclone.shard_map(alias)``: the per-device function
    itself updates the state it is given in place (the whole state with in_spec ``P()``, the
    batch split with ``P(AXIS)``), and the update reaches the caller's dict as global arrays
    replicated over all 4 devices, as the state was passed in.

    The gradient is that of the global loss, ``pmean`` of the shard's loss, taken inside the
    ``shard_map`` with respect to the replicated parameters: ``pmean`` scales each shard's
    cotangent by 1/4 and the gradient of a replicated input is summed over the axis, so the
    result is the global mean's gradient, replicated (no explicit reduction of the gradients:
    that would count them again), and so is every value written back into the state, as its
    in_spec ``P()`` requires.
    """
    import treeclone
    from jax.sharding import PartitionSpec as P

    def shard_step(state, x, y):
        def global_loss(params):
            return jax.lax.pmean(loss_fn(params, x, y), AXIS)

        loss, grads = jax.value_and_grad(global_loss)(state["params"])
        apply_update(state, grads)
        return loss

    sharded = treeclone.shard_map(
        shard_step,
        mesh=setup.mesh,
        in_specs=(P(), P(AXIS), P(AXIS)),
        out_specs=P(),
        policy="alias",
    )
    step = treeclone.jit(sharded, policy="alias")
    state = setup.place_state()
    initial = fetch(state["params"])
    losses = []
    for i in range(STEPS):
        losses.append(float(fetch(step(state, setup.x, setup.y))))
        assert int(fetch(state["step"])) == i + 1, f"step {i}: the caller's step not advanced"
    for leaf in jax.tree.leaves(state):
        assert leaf.sharding.is_equivalent_to(setup.replicated, leaf.ndim), leaf.sharding
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), fetch(state["params"]), initial)
    assert all(jax.tree.leaves(moved)), "alias: the caller's params were not updated"
    return {**fetch(state), "losses": losses}


def shardings(state: dict[str, Any]) -> dict[str, Any]:
    return {
        jax.tree_util.keystr(p): x.sharding for p, x in jax.tree_util.tree_leaves_with_path(state)
    }


def check_placed(state: dict[str, Any], initial: dict[str, Any], where: str) -> None:
    """Every leaf of the caller's state is placed as it was at the start."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        want = initial[jax.tree_util.keystr(path)]
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), (
            f"{where}: state{jax.tree_util.keystr(path)} is placed at {leaf.sharding}, it "
            f"started at {want}"
        )


def alias_jit_2d(setup: Setup) -> dict[str, Any]:
    """``alias`` on a ``data x model`` mesh (issue 48): the state updated in place keeps every
    leaf's placement, the first layer's weights split over ``model`` and the rest replicated
    (XLA alone would move the first layer's bias and its momentum onto ``model``), with no
    ``out_shardings``; the caller's dict is its own."""
    import treeclone

    setup = Setup(two_d=True)
    state = setup.place_state()
    initial = shardings(state)
    step = treeclone.jit(train_step, policy="alias")
    losses = []
    for i in range(STEPS):
        losses.append(float(fetch(step(state, setup.x, setup.y))))
        check_placed(state, initial, f"step {i}")
    return {**fetch(state), "losses": losses}


def jit_partial_2d_donated(setup: Setup) -> dict[str, Any]:
    """``jit_partial`` of the same step, the state bound and donated, on the 2-D mesh: each
    donated buffer is reused (the old arrays deleted) and every leaf keeps its placement."""
    import treeclone

    setup = Setup(two_d=True)
    state = setup.place_state()
    initial = shardings(state)
    step = treeclone.jit_partial(train_step, state, policy="alias", donate_argnums=0)
    losses = []
    for i in range(STEPS):
        old = jax.tree.leaves(state)
        losses.append(float(fetch(step(setup.x, setup.y))))
        assert all(a.is_deleted() for a in old), f"step {i}: a donated array was not deleted"
        check_placed(state, initial, f"step {i}")
    return {**fetch(state), "losses": losses}


# name -> scenario; each returns the final state (NumPy leaves) and its losses, which the
# test compares with reference(). Adding one is one more entry here.
SCENARIOS: dict[str, Callable[[Setup], dict[str, Any]]] = {
    "alias_jit": alias_jit,
    "alias_jit_returning": alias_jit_returning,
    "clone_jit": clone_jit,
    "strict_jit": strict_jit,
    "alias_jit_of_shard_map": alias_jit_of_shard_map,
    "alias_shard_map": alias_shard_map,
    "alias_jit_2d": alias_jit_2d,
    "jit_partial_2d_donated": jit_partial_2d_donated,
}


def flat(result: dict[str, Any]) -> dict[str, np.ndarray]:
    """A result as NumPy arrays keyed by their key paths (for ``np.savez``)."""
    leaves = jax.tree_util.tree_flatten_with_path(result)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def main(argv: list[str]) -> None:
    process_id, num_processes, port, out_dir = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    host = argv[4] if len(argv) > 4 else "127.0.0.1"  # a loopback the test could open
    # Short timeouts: a peer that never comes (or died) fails this process in seconds rather
    # than minutes; the test's own timeout is the backstop.
    jax.distributed.initialize(
        coordinator_address=f"{host}:{port}",
        # Process 0 runs the coordinator; it listens on the loopback interface only (the
        # default binds every interface).
        coordinator_bind_address=f"{host}:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=30,
        heartbeat_timeout_seconds=10,
        shutdown_timeout_seconds=10,
    )
    assert jax.process_count() == num_processes, jax.process_count()
    assert jax.process_index() == process_id, jax.process_index()
    assert jax.device_count() == num_processes * jax.local_device_count()
    setup = Setup()
    results = {}
    for name, scenario in SCENARIOS.items():
        for key, value in flat(scenario(setup)).items():
            results[f"{name}{key}"] = value
    path = os.path.join(out_dir, f"process{process_id}.npz")
    np.savez(path + ".tmp.npz", **results)
    os.replace(path + ".tmp.npz", path)
    jax.distributed.shutdown()
    print(f"WORKER-OK {process_id}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
