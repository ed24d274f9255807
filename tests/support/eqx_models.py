"""Generated equinox models (hypothesis strategies) and how to compare them: shared by the
tests that check treeclone's filtered transformations against equinox's
(``tests/transforms/test_filter_properties.py``, ``tests/transforms/test_traced_loops.py``).

``eqx_spec`` describes a nested ``eqx.Module`` tree made of ``eqx.nn.Linear``, ``eqx.nn.MLP``
(activations: ``jax.nn.relu``, ``jnp.tanh``, a user's function, a ``functools.partial``, a
learnt ``eqx.nn.PReLU``; hidden layers scanned or not), a custom Module whose fields are
generated (float and integer JAX arrays, NumPy arrays and scalars, a string, a bool, a Python
float and int, a function, None) and groups holding their submodules in a tuple, a list or a
dict; ``build`` makes it. ``sgd_step`` is a training step written for ``eqx.filter_jit``.

``NamedMLP`` is a fixed model: an ``eqx.nn.MLP`` and a name (``tests/transforms/
test_traced_branches.py``, ``tests/jit/test_traced_jit_options.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

D = 3  # the input width of every generated equinox piece
LR = 0.1


def is_none(x: Any) -> bool:
    return x is None


def plain(x: Any) -> np.ndarray:
    """An array leaf as NumPy (a PRNG key as its data), to compare values."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        x = jax.random.key_data(x)
    return np.asarray(x)


def close(a: Any, b: Any, where: str, scale: float = 1.0) -> None:
    """Equal up to rounding: jit and eager (or two compilations) may fuse and order a sum
    differently, so an entry that cancels is compared against ``scale``, the magnitude of the
    values it is computed with."""
    atol = 1e-5 * max(1.0, scale)
    np.testing.assert_allclose(plain(a), plain(b), rtol=1e-4, atol=atol, err_msg=where)


def assert_same_leaves(got: Any, want: Any) -> None:
    """One structure; arrays close (float32 digits), every other leaf the same object or equal."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        if eqx.is_array(b):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        else:
            assert a is b or a == b, (a, b)


def scale_of(tree: Any) -> float:
    """The largest magnitude among the floating array leaves of ``tree``."""
    floats = [x for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    return max((float(np.max(np.abs(x), initial=0.0)) for x in floats), default=0.0)


class NamedMLP(eqx.Module):
    """An ``eqx.nn.MLP`` and a name: a string leaf, which jax.jit cannot trace."""

    mlp: eqx.nn.MLP
    name: str

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.mlp(x)


# --- equinox: generated modules -----------------------------------------------------------------


def wiggle(x: jax.Array) -> jax.Array:
    """A user's activation function (SiLU written out)."""
    return x * jax.nn.sigmoid(x)


LEAKY = functools.partial(jax.nn.leaky_relu, negative_slope=0.2)
ACTIVATIONS = [jax.nn.relu, jnp.tanh, wiggle, LEAKY, "prelu"]


def activation(spec: Any) -> Any:
    # A learnt activation: an eqx.nn.PReLU (a Module with a float array), which eqx.nn.MLP
    # copies for every neuron.
    return eqx.nn.PReLU() if spec == "prelu" else spec


class Custom(eqx.Module):
    """Typed fields of every kind equinox users write, and generated array fields."""

    act: Callable
    name: str
    flag: bool
    scale: float
    power: int
    nothing: Any
    fields: dict

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jnp.zeros(())
        for k in sorted(self.fields):  # a dict comes back from a trace with sorted keys
            h = h + jnp.sum(self.act(self.fields[k] * x))
        h = h * self.scale + 0.01 * len(self.name)
        if self.flag:  # Python control flow on a static leaf
            h = h * (1.0 + 0.1 * self.power)
        return h


class Group(eqx.Module):
    """Submodules in a tuple, a list or a dict, and a function that combines their outputs."""

    children: Any
    mix: Callable

    def __call__(self, x: jax.Array) -> jax.Array:
        kids = self.children
        kids = [kids[k] for k in sorted(kids)] if isinstance(kids, dict) else list(kids)
        return sum((self.mix(kid(x)) for kid in kids), jnp.zeros(()))


class Head(eqx.Module):
    """An ``eqx.nn.Linear`` or ``eqx.nn.MLP`` reduced to a scalar."""

    layer: Any

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.sum(self.layer(x))


def field_value(kind: str, rng: np.random.Generator) -> Any:
    if kind == "float":
        return jnp.asarray(rng.normal(size=D), jnp.float32)
    if kind == "float_scalar":
        return jnp.asarray(rng.normal(), jnp.float32)
    if kind == "np_float":
        return rng.normal(size=D).astype(np.float32)
    if kind == "np_scalar":
        return np.float32(rng.normal())
    if kind == "int":
        return jnp.asarray(rng.integers(-2, 3, size=D), jnp.int32)
    if kind == "np_int":
        return rng.integers(-2, 3, size=D).astype(np.int32)
    raise AssertionError(kind)


FIELD_KINDS = ["float", "float_scalar", "np_float", "np_scalar", "int", "np_int"]

linear_spec = st.tuples(st.just("linear"), st.integers(1, 3), st.booleans())
mlp_spec = st.tuples(
    st.just("mlp"),
    st.one_of(st.integers(1, 3), st.just("scalar")),  # out_size
    st.integers(1, 4),  # width
    st.integers(0, 3),  # depth
    st.sampled_from(ACTIVATIONS),
    st.sampled_from([*ACTIVATIONS[:-1], jax.nn.sigmoid]),  # final activation
    st.booleans(),  # use_bias
    st.booleans(),  # scan the hidden layers
)
custom_spec = st.tuples(
    st.just("custom"),
    st.sampled_from(ACTIVATIONS[:-1]),
    st.text("abcxyz-", min_size=0, max_size=6),
    st.booleans(),
    st.floats(0.25, 2.0, width=32),
    st.integers(0, 3),
    st.sampled_from([None, "nothing"]),
    st.lists(st.sampled_from(FIELD_KINDS), min_size=0, max_size=4),
)
eqx_spec = st.recursive(
    st.one_of(linear_spec, mlp_spec, custom_spec),
    lambda kids: st.tuples(
        st.just("group"),
        st.sampled_from(["tuple", "list", "dict"]),
        st.lists(kids, min_size=1, max_size=3),
        st.sampled_from([jnp.tanh, jax.nn.softplus, wiggle]),
        st.booleans(),  # the first submodule again at the end (one object at two places)
    ),
    max_leaves=4,
)


def build(spec: tuple, seed: int, shared: bool = True) -> Any:
    """The equinox model ``spec`` describes; the same ``spec`` and ``seed`` give equal models.
    ``shared=False``: no submodule at two places."""
    rng = np.random.default_rng(seed)

    def key() -> jax.Array:
        return jax.random.key(int(rng.integers(2**31)))

    def make(spec: tuple) -> Any:
        kind = spec[0]
        if kind == "linear":
            _, out, bias = spec
            return Head(eqx.nn.Linear(D, out, use_bias=bias, key=key()))
        if kind == "mlp":
            _, out, width, depth, act, final, bias, scan = spec
            mlp = eqx.nn.MLP(
                D,
                out,
                width,
                depth,
                activation=activation(act),
                final_activation=final,
                use_bias=bias,
                scan=scan and depth >= 2,
                key=key(),
            )
            return Head(mlp)
        if kind == "custom":
            _, act, name, flag, scale, power, nothing, kinds = spec
            fields = {f"{k}{i}": field_value(k, rng) for i, k in enumerate(kinds)}
            return Custom(act, name, flag, float(scale), power, nothing, fields)
        _, container, kids, mix, again = spec
        children = [make(kid) for kid in kids]
        if again and shared:
            children.append(children[0])
        if container == "tuple":
            return Group(tuple(children), mix)
        if container == "dict":
            return Group({f"k{len(children) - i}": c for i, c in enumerate(children)}, mix)
        return Group(children, mix)

    return make(spec)


def eqx_loss(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return (model(x) - y) ** 2


def sgd_step(model: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
    """An optax-free SGD step as written for ``eqx.filter_jit``."""
    loss, grads = eqx.filter_value_and_grad(eqx_loss)(model, x, y)
    updates = jax.tree.map(lambda g: -LR * g, grads)
    return loss, eqx.apply_updates(model, updates)


def data(seed: int) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(seed), (D,))
    return x, jnp.asarray(0.5, jnp.float32)


def assert_same_model(got: Any, want: Any) -> None:
    """The same structure (static fields included), equal arrays and equal other leaves."""
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def
    scale = scale_of(want)
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if eqx.is_array(b):
            assert eqx.is_array(a), (i, a, b)
            close(a, b, f"leaf {i}", scale)
        else:
            assert a is b or a == b, (i, a, b)


def assert_statics_are(got: Any, model: Any) -> None:
    """Every leaf of ``got`` that is not an array is the very object ``model`` holds there."""
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    leaves, treedef = jax.tree_util.tree_flatten(model)
    assert got_def == treedef
    for i, (a, b) in enumerate(zip(got_leaves, leaves, strict=True)):
        if not eqx.is_array(b):
            assert a is b, (i, a, b)


def assert_same_grads(got: Any, want: Any) -> None:
    """``eqx.filter_grad``'s form: the same structure, None at the same leaves, equal arrays."""
    assert jax.tree.structure(got, is_leaf=is_none) == jax.tree.structure(want, is_leaf=is_none)
    got_leaves = jax.tree.leaves(got, is_leaf=is_none)
    want_leaves = jax.tree.leaves(want, is_leaf=is_none)
    scale = scale_of(want)
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if b is None:
            assert a is None, (i, a)
        else:
            assert eqx.is_array(a), (i, a)
            close(a, b, f"gradient leaf {i}", scale)
