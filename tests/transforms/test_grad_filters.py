"""What ``treeclone.grad`` / ``value_and_grad`` differentiate (``wrt=``), against the libraries'
own transformations: with ``wrt=nnx.Param`` (or any nnx filter), the loss, gradient and every
Variable afterwards are ``nnx.value_and_grad``'s, and the gradient is the ``nnx.State`` that
``nnx.Optimizer.update`` takes (shared Variables once), on models with Dropout (``nnx.Rngs``
holds a uint32 counter), BatchNorm in training mode, an integer Variable and shared Variables;
with ``wrt="arrays"`` the value and gradient are ``eqx.filter_value_and_grad``'s (None at the
leaves that are not inexact arrays: a function, a string) under every policy, and optax and
``eqx.apply_updates`` take it; a predicate gives the argument's structure with None at the
leaves it leaves out.

Without ``wrt=`` (jax.grad's rule: every leaf of the argument) the nnx model is the TypeError
the issue reports (``grad requires real- or complex-valued inputs ... got uint32``), and the
equinox Module with an activation function is one too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from hypothesis import given, settings
from hypothesis import strategies as st

nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")

X = jax.random.normal(jax.random.key(1), (8, 3))
Y = jax.random.normal(jax.random.key(2), (8, 4))


class Net(nnx.Module):
    """Dropout (its Rngs hold a uint32 counter and a key), BatchNorm in training mode, an
    integer counter Variable, a Linear at two attributes and a Param at two attributes."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.lin_again = self.lin  # one Linear, two attributes
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.head = nnx.Linear(4, 4, rngs=rngs)
        self.tied = self.head.bias  # one Param, two attributes
        self.steps = nnx.Variable(jnp.array(0, jnp.int32))

    def __call__(self, x: jax.Array) -> jax.Array:
        self.steps[...] += 1
        h = self.drop(self.bn(self.lin(x) + 0.5 * self.lin_again(x)))
        return self.head(h) + self.tied[...]


def net_loss(model: Net, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def _pair() -> tuple[Net, Net]:
    """The same model twice (same seeds): one for treeclone, one for nnx."""
    return Net(nnx.Rngs(0, dropout=1)), Net(nnx.Rngs(0, dropout=1))


def _plain(x: jax.Array) -> np.ndarray:
    """A leaf as NumPy, a PRNG key as its data, to compare with ``==``."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        x = jax.random.key_data(x)
    return np.asarray(x)


def assert_same_tree(got, want, rtol: float = 1e-6) -> None:
    """Equal structure (State and Variable types included) and equal leaves."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(_plain(a), _plain(b), rtol=rtol, atol=1e-6)


def assert_same_variables(model, reference) -> None:
    """Every Variable of the two models equal (Params, BatchStats, Rng counters and keys,
    the integer counter)."""
    assert_same_tree(nnx.state(model), nnx.state(reference))


# --- nnx: wrt=nnx.Param is nnx.value_and_grad ---------------------------------------------------


def test_without_wrt_an_nnx_model_with_rngs_is_jaxs_integer_error():
    model, _ = _pair()
    message = r"model\.drop\.rngs\.count\.value: grad requires .* got uint32"
    with pytest.raises(TypeError, match=message):
        tc.value_and_grad(net_loss, policy="alias")(model, X, Y)


@pytest.mark.parametrize("wrt", [nnx.Param, nnx.OfType(nnx.Param)])
def test_alias_value_and_grad_wrt_param_is_nnx_value_and_grad(wrt):
    model, reference = _pair()
    for _ in range(2):  # the second call sees the first one's counters and statistics
        loss, grads = tc.value_and_grad(net_loss, policy="alias", wrt=wrt)(model, X, Y)
        want_loss, want_grads = nnx.value_and_grad(net_loss)(reference, X, Y)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
        assert isinstance(grads, nnx.State)
        assert_same_tree(grads, want_grads)
        assert_same_variables(model, reference)
    assert int(model.steps[...]) == 2 and int(model.drop.rngs.count[...]) == 2


def test_gradient_has_a_shared_variable_once_and_the_optimizer_takes_it():
    model, reference = _pair()
    _, grads = tc.value_and_grad(net_loss, policy="alias", wrt=nnx.Param)(model, X, Y)
    paths = {p for p, _ in nnx.to_flat_state(grads)}
    assert ("lin", "kernel") in paths and ("lin_again", "kernel") not in paths
    assert ("head", "bias") in paths and ("tied",) not in paths
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    optimizer.update(model, grads)
    _, want = nnx.value_and_grad(net_loss)(reference, X, Y)
    nnx.Optimizer(reference, optax.adam(1e-2), wrt=nnx.Param).update(reference, want)
    assert_same_variables(model, reference)


def test_a_filter_object_differentiates_what_nnx_differentiates():
    wrt = nnx.All(nnx.Param, nnx.PathContains("head"))
    model, reference = _pair()
    loss, grads = tc.value_and_grad(net_loss, policy="alias", wrt=wrt)(model, X, Y)
    want_loss, want = nnx.value_and_grad(net_loss, argnums=nnx.DiffState(0, wrt))(reference, X, Y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    assert_same_tree(grads, want)
    assert {p for p, _ in nnx.to_flat_state(grads)} == {("head", "bias"), ("head", "kernel")}
    assert_same_variables(model, reference)


def test_clone_and_strict_give_nnx_gradients_and_leave_or_name_the_model():
    model, reference = _pair()
    before = nnx.state(model)
    before = jax.tree.map(lambda x: x, before)  # fresh leaves: the model's values now
    _, want = nnx.value_and_grad(net_loss)(reference, X, Y)
    with pytest.warns(tc.MutationWarning, match="discarded"):  # clone: nnx's updates are not kept
        _, grads = tc.value_and_grad(net_loss, wrt=nnx.Param)(model, X, Y)
    assert_same_tree(grads, want)
    assert_same_tree(nnx.state(model), before)  # clone: the caller's model is as it was
    with pytest.raises(tc.MutationError, match="steps"):
        tc.value_and_grad(net_loss, policy="strict", wrt=nnx.Param)(model, X, Y)


def test_grad_with_aux_and_argnums_tuple():
    def loss_aux(model, x, y):
        return net_loss(model, x, y), model.steps[...]

    model, reference = _pair()
    (grads,), aux = tc.grad(loss_aux, argnums=(0,), has_aux=True, policy="alias", wrt=nnx.Param)(
        model, X, Y
    )
    (want,), want_aux = nnx.grad(loss_aux, argnums=(0,), has_aux=True)(reference, X, Y)
    assert_same_tree(grads, want)
    assert int(aux) == int(want_aux) == 1
    assert_same_variables(model, reference)


def _train_step(grad_fn):
    def step(model, optimizer, x, y):
        loss, grads = grad_fn(net_loss)(model, x, y)
        optimizer.update(model, grads)
        return loss

    return step


def test_three_jitted_training_steps_match_nnx_jit():
    model, reference = _pair()
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    ref_optimizer = nnx.Optimizer(reference, optax.adamw(1e-2), wrt=nnx.Param)
    step = tc.jit(
        _train_step(lambda f: tc.value_and_grad(f, policy="alias", wrt=nnx.Param)),
        policy="alias",
    )
    ref_step = nnx.jit(_train_step(nnx.value_and_grad))
    for _ in range(3):
        loss = step(model, optimizer, X, Y)
        want = ref_step(reference, ref_optimizer, X, Y)
        np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert_same_variables(model, reference)
    assert_same_tree(nnx.state(optimizer), nnx.state(ref_optimizer), rtol=1e-5)
    assert int(model.steps[...]) == 3


# --- equinox: wrt="arrays" is eqx.filter_value_and_grad -----------------------------------------


class EqxNet(eqx.Module):
    """An MLP (it holds its activation function), a function field and a string field."""

    mlp: eqx.nn.MLP
    act: object
    name: str

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(self.mlp(x))


def eqx_loss(model: EqxNet, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def _eqx_net(seed: int = 0, width: int = 8, depth: int = 2) -> EqxNet:
    return EqxNet(eqx.nn.MLP(3, 4, width, depth, key=jax.random.key(seed)), jnp.tanh, "net")


def assert_same_eqx_grads(got, want) -> None:
    """Equal structure, None at the same places, equal arrays."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    is_none = lambda x: x is None  # noqa: E731 - None leaves, compared as such
    assert jax.tree.structure(got, is_leaf=is_none) == jax.tree.structure(want, is_leaf=is_none)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_without_wrt_an_eqx_module_with_a_function_is_a_type_error():
    with pytest.raises(TypeError, match="not a valid JAX type"):
        tc.value_and_grad(eqx_loss, policy="alias")(_eqx_net(), X, Y)


@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
@pytest.mark.parametrize("wrt", ["arrays", "equinox"])
def test_wrt_arrays_is_eqx_filter_value_and_grad(policy, wrt):
    model = _eqx_net()
    loss, grads = tc.value_and_grad(eqx_loss, policy=policy, wrt=wrt)(model, X, Y)
    want_loss, want = eqx.filter_value_and_grad(eqx_loss)(model, X, Y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    assert_same_eqx_grads(grads, want)
    assert grads.act is None and grads.name is None and grads.mlp.activation is None


@pytest.mark.parametrize("policy", ["clone", "alias"])
def test_optax_adamw_and_apply_updates_take_the_gradient(policy):
    model, reference = _eqx_net(), _eqx_net()
    tx = optax.adamw(1e-2)
    state = tx.init(eqx.filter(model, eqx.is_inexact_array))
    ref_state = tx.init(eqx.filter(reference, eqx.is_inexact_array))
    grad_fn = tc.jit(tc.value_and_grad(eqx_loss, policy=policy, wrt="arrays"), traced="arrays")
    for _ in range(2):
        _, grads = grad_fn(model, X, Y)
        updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        model = eqx.apply_updates(model, updates)
        _, want = eqx.filter_value_and_grad(eqx_loss)(reference, X, Y)
        ref_updates, ref_state = tx.update(
            want, ref_state, eqx.filter(reference, eqx.is_inexact_array)
        )
        reference = eqx.apply_updates(reference, ref_updates)
    assert_same_eqx_grads(eqx.filter(model, eqx.is_array), eqx.filter(reference, eqx.is_array))
    assert model.act is jnp.tanh and model.name == "net"


def test_arrays_rule_carries_integer_arrays_and_python_leaves():
    def f(tree):
        return jnp.sum(tree["w"] * tree["n"]) + tree["scale"] * jnp.sum(tree["i"])

    tree = {"w": jnp.ones(3), "i": jnp.arange(3), "n": np.float32(2.0), "scale": 3, "f": abs}
    grads = tc.grad(f, policy="alias", wrt="arrays")(tree)
    want = eqx.filter_grad(f)(tree)
    assert_same_eqx_grads(grads, want)
    assert grads["i"] is None and grads["scale"] is None and grads["f"] is None


# --- a predicate on (key path, leaf) ------------------------------------------------------------


def test_predicate_differentiates_the_leaves_it_names_and_none_elsewhere():
    def f(params, x):
        params["calls"] = params["calls"] + 1  # carried, updated in place under alias
        return jnp.sum(params["w"] * x) + jnp.sum(params["b"])

    params = {"w": jnp.ones(2), "b": jnp.ones(2), "calls": jnp.zeros((), jnp.int32), "tag": "x"}
    only_w = lambda path, leaf: path[0].key == "w"  # noqa: E731 - a predicate, as a user writes it
    grads = tc.grad(f, policy="alias", wrt=only_w)(params, jnp.array([2.0, 3.0]))
    assert grads["b"] is None and grads["calls"] is None and grads["tag"] is None
    np.testing.assert_allclose(grads["w"], [2.0, 3.0])
    assert int(params["calls"]) == 1
    assert jax.tree.structure(grads, is_leaf=lambda x: x is None) == jax.tree.structure(
        {"b": None, "calls": None, "tag": None, "w": 0}, is_leaf=lambda x: x is None
    )


def test_wrt_none_is_jax_grad():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}

    def f(p):
        return jnp.sum(p["w"] * 2.0 + p["b"])

    for policy in ("clone", "alias"):
        assert_same_tree(tc.grad(f, policy=policy, wrt=None)(params), jax.grad(f)(params))


# --- property: generated small models against nnx and equinox ------------------------------------


class GenNet(nnx.Module):
    """A stack of ``sizes`` Linears, each optionally followed by BatchNorm or Dropout, an
    optional counter and an optional Linear shared with the first layer."""

    def __init__(self, sizes, bn, drop, counter, shared, rngs):
        self.layers = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        )
        self.norms = nnx.List(
            [nnx.BatchNorm(b, rngs=rngs) if bn else None for b in sizes[1:]]  # training mode
        )
        self.drop = nnx.Dropout(0.25, rngs=rngs) if drop else None
        self.counter = nnx.Variable(jnp.array(0, jnp.uint32)) if counter else None
        self.first = self.layers[0] if shared else None

    def __call__(self, x):
        if self.counter is not None:
            self.counter[...] += 1
        if self.first is not None:
            x = x + 0.1 * jnp.sum(self.first(x))
        for layer, norm in zip(self.layers, self.norms, strict=True):
            x = layer(x)
            if norm is not None:
                x = norm(x)
            x = jnp.tanh(x)
            if self.drop is not None:
                x = self.drop(x)
        return x


def gen_loss(model, x):
    return jnp.mean(model(x) ** 2)


@settings(max_examples=profiles.max_examples(8))
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    bn=st.booleans(),
    drop=st.booleans(),
    counter=st.booleans(),
    shared=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_filtered_value_and_grad_is_nnx(sizes, bn, drop, counter, shared, seed):
    sizes = [3, *sizes]
    if shared:
        sizes[1] = 3  # the shared first layer also maps the input to its own width
    make = lambda: GenNet(sizes, bn, drop, counter, shared, nnx.Rngs(seed, dropout=seed + 1))  # noqa: E731
    model, reference = make(), make()
    x = jax.random.normal(jax.random.key(seed), (4, 3))
    loss, grads = tc.value_and_grad(gen_loss, policy="alias", wrt=nnx.Param)(model, x)
    want_loss, want = nnx.value_and_grad(gen_loss)(reference, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    assert_same_tree(grads, want, rtol=1e-5)
    assert_same_variables(model, reference)


@settings(max_examples=profiles.max_examples(8))
@given(width=st.integers(1, 5), depth=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_property_arrays_rule_is_eqx_filter_value_and_grad(width, depth, seed):
    model = _eqx_net(seed, width, depth)
    loss, grads = tc.value_and_grad(eqx_loss, policy="alias", wrt="arrays")(model, X, Y)
    want_loss, want = eqx.filter_value_and_grad(eqx_loss)(model, X, Y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    assert_same_eqx_grads(grads, want)
