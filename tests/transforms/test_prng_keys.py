"""Typed PRNG keys (``jax.random.key``: dtype ``key<fry>``, which NumPy cannot interpret) through
every treeclone transformation under ``alias`` and ``strict``, against the plain Python program
the call stands for, run eagerly on a copy of the same state: ``alias`` leaves the caller's
state as plain Python leaves it and returns what it returns; ``strict`` returns the same values
and leaves the caller's state as it was. Every nnx model with ``nnx.Rngs`` or ``Dropout`` holds
such keys: one in ``treeclone.cond`` against the plain ``if`` on a copy of the model."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

nnx = pytest.importorskip("flax.nnx")

W = jnp.asarray([1.0, -2.0, 0.5])


def _state() -> dict:
    return {"key": jax.random.key(0), "x": jnp.zeros(3), "n": jnp.zeros((), jnp.int32)}


def _batched_state() -> dict:
    return {
        "key": jax.random.split(jax.random.key(1), 3),
        "x": jnp.zeros((3, 3)),
        "n": jnp.zeros(3, jnp.int32),
    }


def step(s: dict) -> dict:
    """Draws with the state's key and advances it, in place; returns the state."""
    s["key"], sub = jax.random.split(s["key"])
    s["x"] = s["x"] + jax.random.uniform(sub, s["x"].shape)
    s["n"] = s["n"] + 1
    return s


def other(s: dict) -> dict:
    """The other branch: another key, nothing drawn."""
    s["key"] = jax.random.fold_in(s["key"], 7)
    return s


def loss(w: jax.Array, s: dict) -> tuple:
    step(s)
    return jnp.sum(w * s["x"]), s


def _plain_grad(w: jax.Array, s: dict) -> tuple:
    _, aux = loss(w, s)
    return s["x"], aux  # d/dw sum(w * x) at the new x


def _plain_value_and_grad(w: jax.Array, s: dict) -> tuple:
    value, aux = loss(w, s)
    return (value, aux), s["x"]


def _plain_vmap(s: dict) -> dict:
    rows = [step({k: v[i] for k, v in s.items()}) for i in range(len(s["n"]))]
    for k in s:
        s[k] = jnp.stack([r[k] for r in rows])
    return s


def _plain_scan(s: dict) -> tuple:
    ys = []
    for x in jnp.arange(3.0):
        step(s)
        ys.append(jnp.sum(s["x"]) * x)
    return s, jnp.stack(ys)


def _scan_body(c: dict, x: jax.Array) -> tuple:
    step(c)
    return c, jnp.sum(c["x"]) * x


def _plain_loop(s: dict) -> dict:
    for _ in range(3):
        step(s)
    return s


def _plain_while(s: dict) -> dict:
    while s["n"] < 3:
        step(s)
    return s


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]), ("data",))


# name -> (the treeclone call under a policy and traced= rule (grad has none: it differentiates
# W alone), the plain Python program, and the state it runs on)
TRANSFORMATIONS = {
    "jit": (lambda s, p, t: tc.jit(step, policy=p, traced=t)(s), step, _state),
    "jit_partial": (lambda s, p, t: tc.jit_partial(step, s, policy=p, traced=t)(), step, _state),
    "grad": (
        lambda s, p, t: tc.grad(loss, has_aux=True, policy=p)(W, s),
        lambda s: _plain_grad(W, s),
        _state,
    ),
    "value_and_grad": (
        lambda s, p, t: tc.value_and_grad(loss, has_aux=True, policy=p)(W, s),
        lambda s: _plain_value_and_grad(W, s),
        _state,
    ),
    "vmap": (lambda s, p, t: tc.vmap(step, policy=p, traced=t)(s), _plain_vmap, _batched_state),
    "scan": (
        lambda s, p, t: tc.scan(_scan_body, s, jnp.arange(3.0), policy=p, traced=t),
        _plain_scan,
        _state,
    ),
    "fori_loop": (
        lambda s, p, t: tc.fori_loop(0, 3, lambda i, c: step(c), s, policy=p, traced=t),
        _plain_loop,
        _state,
    ),
    "while_loop": (
        lambda s, p, t: tc.while_loop(lambda c: c["n"] < 3, step, s, policy=p, traced=t),
        _plain_while,
        _state,
    ),
    "cond": (lambda s, p, t: tc.cond(True, step, other, s, policy=p, traced=t), step, _state),
    "cond_traced_predicate": (
        lambda s, p, t: tc.jit(
            lambda pred, s: tc.cond(pred, step, other, s, policy=p, traced=t), policy=p
        )(jnp.asarray(False), s),
        other,
        _state,
    ),
    "switch": (
        lambda s, p, t: tc.switch(1, [other, step, other], s, policy=p, traced=t),
        step,
        _state,
    ),
    "switch_traced_index": (
        lambda s, p, t: tc.jit(
            lambda i, s: tc.switch(i, [step, step, other], s, policy=p, traced=t), policy=p
        )(jnp.asarray(2), s),
        other,
        _state,
    ),
    "checkpoint": (lambda s, p, t: tc.checkpoint(step, policy=p, traced=t)(s), step, _state),
    "shard_map": (
        lambda s, p, t: tc.shard_map(
            step, mesh=_mesh(), in_specs=(P(),), out_specs=P(), policy=p, traced=t
        )(s),
        step,
        _state,
    ),
}


def _values(tree: object) -> list:
    """Every leaf as ``(dtype, NumPy value)``: a key by its key data (and its key dtype)."""
    out = []
    for x in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
            out.append((str(x.dtype), np.asarray(jax.random.key_data(x))))
        else:
            out.append((str(jnp.asarray(x).dtype), np.asarray(x)))
    return out


def _assert_same(actual: object, expected: object) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for (da, a), (de, e) in zip(_values(actual), _values(expected), strict=True):
        assert da == de
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("traced", [None, "arrays"])
@pytest.mark.parametrize("policy", ["alias", "strict"])
@pytest.mark.parametrize("name", list(TRANSFORMATIONS))
def test_typed_prng_keys_through_every_transformation_as_plain_python(name, policy, traced):
    lifted, plain, make = TRANSFORMATIONS[name]
    state, reference = make(), make()
    before = copy.copy(state)
    expected = plain(reference)
    out = lifted(state, policy, traced)
    _assert_same(out, expected)
    for v in jax.tree.leaves(state):
        assert not isinstance(v, jax.core.Tracer)
    if policy == "alias":
        _assert_same(state, reference)  # the caller's state, as plain Python leaves it
    else:
        assert state == before or all(state[k] is before[k] for k in before)  # untouched


class Noisy(nnx.Module):
    """A model holding typed keys: its Dropout's own ``nnx.Rngs`` stream, and a count."""

    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 4, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.calls = nnx.Variable(jnp.zeros((), jnp.int32))


def noisy_train(model: Noisy, x: jax.Array) -> jax.Array:
    model.calls[...] += 1
    return model.dropout(model.linear(x), deterministic=False)


def noisy_eval(model: Noisy, x: jax.Array) -> jax.Array:
    return model.linear(x)


def returning(branch):
    return lambda model, x: (model, branch(model, x))


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_nnx_model_with_rngs_and_dropout_in_cond_as_plain_python(policy):
    x = jnp.ones((2, 4))
    model, reference = Noisy(nnx.Rngs(0)), Noisy(nnx.Rngs(0))
    before = nnx.state(model)
    if policy == "strict":
        # The Dropout's key stream advances in place: not returned, it is named.
        with pytest.raises(tc.MutationError, match=r"model\.dropout\.rngs\.count"):
            tc.cond(True, noisy_train, noisy_eval, model, x, policy="strict")
        _assert_same(nnx.state(model), before)
        # Returned, it is allowed: the values plain Python gives, the caller's model untouched.
        for pred in (True, jnp.asarray(False)):
            ours = tc.cond(
                pred, returning(noisy_train), returning(noisy_eval), model, x, policy=policy
            )
            fresh = Noisy(nnx.Rngs(0))  # the caller's model as strict leaves it: as it was
            theirs = returning(noisy_train if pred else noisy_eval)(fresh, x)
            _assert_same(nnx.state(ours[0]), nnx.state(theirs[0]))
            _assert_same(ours[1], theirs[1])
            _assert_same(nnx.state(model), before)
        return
    for pred in (True, jnp.asarray(True), False, jnp.asarray(False), True):
        ours = tc.cond(pred, noisy_train, noisy_eval, model, x, policy="alias")
        theirs = (noisy_train if pred else noisy_eval)(reference, x)
        _assert_same(ours, theirs)
        _assert_same(nnx.state(model), nnx.state(reference))
    assert int(model.calls[...]) == 3


def test_branches_returning_a_key_and_an_array_get_jaxs_error_naming_key_dtype():
    s = _state()
    with pytest.raises(TypeError, match=r"key<fry>\[\].*float32\[3\]"):
        tc.cond(jnp.asarray(True), lambda s: s["key"], lambda s: s["x"], s, policy="alias")


def _share_first(s: dict) -> None:
    s["b"] = s["a"]


def _share_second(s: dict) -> None:
    s["c"] = s["b"]


@pytest.mark.parametrize("pred", [True, False])
def test_branches_sharing_keys_in_different_ways_as_plain_python(pred):
    # Neither branch's structure holds the places apart (a and b one key in the first, b and c
    # in the second): the joined plan rebuilds it around placeholder keys, one per place.
    s = {"a": jax.random.key(0), "b": jax.random.key(1), "c": jax.random.key(2)}
    reference = dict(s)
    (_share_first if pred else _share_second)(reference)
    run = tc.jit(
        lambda p, s: tc.cond(p, _share_first, _share_second, s, policy="alias"), policy="alias"
    )
    run(jnp.asarray(pred), s)  # a traced predicate: the branches' plans joined
    _assert_same(s, reference)
