"""Count what ``jit_partial``'s check costs per call on common bound states, without timing
(docs/semantics.md, "jit_partial"): how many times the bound arguments were flattened whole
over ``--calls`` steps, and how many registered nodes each check flattens again (one level,
``Snapshot.flattened_at_each_check``: the nodes whose flatten may read more than the snapshot
watches).

    python benches/snapshot_counts.py [--calls 20]

The states: a 20-block nnx model with its ``nnx.Optimizer`` (adam), a dict of arrays with an
optax adam state, an equinox MLP (its arrays traced; immutable, so nothing is written back),
and, for contrast, a ``defaultdict`` and a list of registered classes whose flatten is Python
code. The other steps update the bound state in place (a write-back at every call), as a
training step does.
"""

from __future__ import annotations

import argparse
import collections

import jax
import jax.numpy as jnp
import treeclone as tc
from treeclone._jit import bound as bound_module


def _nnx_state():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(8, 8, rngs=rngs)

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.blocks = nnx.List([Block(rngs) for _ in range(20)])

    import optax

    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    def step(model, optimizer, x):
        def loss(m):
            y = jnp.full((8,), x)
            for b in m.blocks:
                y = b.linear(y)
            return (y**2).mean()

        grads = nnx.grad(loss)(model)
        optimizer.update(model, grads)

    return step, (model, optimizer), {}


def _dict_state():
    import optax

    params = {f"w{i}": jnp.ones((8,)) for i in range(20)}
    opt = optax.adam(1e-3)
    state = {"params": params, "opt": opt.init(params)}

    def step(state, x):
        grads = jax.tree.map(lambda w: w * x, state["params"])
        updates, state["opt"] = opt.update(grads, state["opt"], state["params"])
        for k, u in updates.items():
            state["params"][k] = state["params"][k] + u

    return step, (state,), {}


def _eqx_state():
    import equinox as eqx

    mlp = eqx.nn.MLP(8, 8, 32, 4, key=jax.random.key(0))

    def step(mlp, x):  # equinox Modules are immutable: nothing is written back
        return mlp(jnp.full(8, x)).sum()

    return step, (mlp,), {"traced": eqx.is_array}


# tests/support/node_kinds.py has the same class; kept here as the benches import nothing from
# tests/ (and the library holds no test models).
@jax.tree_util.register_pytree_node_class
class Scaled:
    """A registered class whose flatten is Python code (aux data from an attribute)."""

    def __init__(self, w, scale):
        self.w, self.scale = w, scale

    def tree_flatten(self):
        return (self.w,), self.scale

    @classmethod
    def tree_unflatten(cls, scale, children):
        return cls(children[0], scale)


def _python_flatten_state():
    state = {
        "d": collections.defaultdict(list, {"w": jnp.ones(8)}),
        "layers": [Scaled(jnp.ones(8), 2.0) for _ in range(10)],
    }

    def step(state, x):
        state["d"]["w"] = state["d"]["w"] * x

    return step, (state,), {}


def count(make, calls: int) -> tuple[int, int | None, bool]:
    step, bound, options = make()
    whole = collections.Counter()
    original = bound_module.BoundArguments.flatten

    def counted(self):
        whole["n"] += 1
        original(self)

    bound_module.BoundArguments.flatten = counted
    try:
        p = tc.jit_partial(step, *bound, **options)
        p(1.0)
        p(1.0)  # the first call after the first flatten reads new instance dicts
        before = whole["n"]
        for _ in range(calls):
            p(1.0)
        snapshot = p._bound.snapshot
        # (None before this count existed: a revision before the check flattened nodes)
        per_check = getattr(snapshot, "flattened_at_each_check", None)
        return whole["n"] - before, per_check, snapshot.checkable
    finally:
        bound_module.BoundArguments.flatten = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    calls = parser.parse_args().calls
    print(f"| bound state | whole flattens in {calls} calls | nodes flattened per check |")
    print("|---|---|---|")
    for name, make in (
        ("nnx 20 blocks + nnx.Optimizer(adam)", _nnx_state),
        ("dict of 20 arrays + optax adam state", _dict_state),
        ("equinox MLP (depth 4)", _eqx_state),
        ("defaultdict + 10 Python-flattened nodes", _python_flatten_state),
    ):
        flattens, per_check, checkable = count(make, calls)
        print(f"| {name} | {flattens} | {per_check if checkable else 'not checkable'} |")


if __name__ == "__main__":
    main()
