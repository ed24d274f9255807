"""treeclone's filtered transformations against equinox's and nnx's on generated modules
(issue 23; docs/semantics.md, "Leaves that are not arrays: `traced=`" and "What is
differentiated: `wrt=`").

Equinox: generated nested ``eqx.Module`` trees made of ``eqx.nn.Linear``, ``eqx.nn.MLP``
(activations: ``jax.nn.relu``, ``jnp.tanh``, a user's function, a ``functools.partial``, a
learnt ``eqx.nn.PReLU``; hidden layers scanned or not), a custom Module whose fields are
generated (float and integer JAX arrays, NumPy arrays and scalars, a string, a bool, a Python
float and int, a function, None) and groups holding their submodules in a tuple, a list or a
dict. An SGD training step written for ``eqx.filter_jit`` (``eqx.filter_value_and_grad`` and
``eqx.apply_updates``) gives, under ``treeclone.jit(step, traced="arrays", policy=P)`` for
every policy, ``eqx.filter_jit``'s loss and model, two steps running, the static leaves the
caller's very objects; ``treeclone.value_and_grad`` / ``grad`` with ``wrt="arrays"`` give
``eqx.filter_value_and_grad`` / ``eqx.filter_grad``'s value and gradient (None where nothing
is differentiated) under every policy, and ``eqx.apply_updates`` takes that gradient.

nnx: generated Modules of ``nnx.Linear`` blocks with ``nnx.BatchNorm`` and ``nnx.Dropout``
(with ``nnx.Rngs``), an integer counter Variable, a float Variable that is not a Param, one
Variable or Linear at two places, in training or evaluation mode.
``treeclone.value_and_grad(loss, wrt=F, policy="alias")`` for ``nnx.Param`` and other nnx
filters (``nnx.All``, ``nnx.Not``, ``nnx.Any``, a tuple of types) gives
``nnx.value_and_grad(loss, argnums=nnx.DiffState(0, F))``'s value and gradient State, which
``nnx.Optimizer(model, optax.sgd(...), wrt=F).update`` takes, and leaves every Variable
(BatchNorm statistics, the counter, the Rngs counts and keys) as nnx leaves its copy of the
model, over two training steps.

Each example compiles (jit) or runs eagerly several transformed calls, so the example counts
are small fixed fractions of the profile's budget (tests/support/profiles.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from hypothesis import given, settings
from hypothesis import strategies as st

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

# A change treeclone would discard (none is made here) must not pass silently.
pytestmark = pytest.mark.filterwarnings("error::treeclone.MutationWarning")

POLICIES = ["clone", "alias", "strict"]
D = 3  # the input width of every generated equinox piece
LR = 0.1


def _is_none(x: Any) -> bool:
    return x is None


def _plain(x: Any) -> np.ndarray:
    """An array leaf as NumPy (a PRNG key as its data), to compare values."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _close(a: Any, b: Any, where: str, scale: float = 1.0) -> None:
    """Equal up to rounding: jit and eager (or two compilations) may fuse and order a sum
    differently, so an entry that cancels is compared against ``scale``, the magnitude of the
    values it is computed with."""
    atol = 1e-5 * max(1.0, scale)
    np.testing.assert_allclose(_plain(a), _plain(b), rtol=1e-4, atol=atol, err_msg=where)


def _scale(tree: Any) -> float:
    """The largest magnitude among the floating array leaves of ``tree``."""
    floats = [x for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    return max((float(np.max(np.abs(x), initial=0.0)) for x in floats), default=0.0)


# --- equinox: generated modules -----------------------------------------------------------------


def wiggle(x: jax.Array) -> jax.Array:
    """A user's activation function (SiLU written out)."""
    return x * jax.nn.sigmoid(x)


LEAKY = functools.partial(jax.nn.leaky_relu, negative_slope=0.2)
ACTIVATIONS = [jax.nn.relu, jnp.tanh, wiggle, LEAKY, "prelu"]


def _activation(spec: Any) -> Any:
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


def _field_value(kind: str, rng: np.random.Generator) -> Any:
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
                activation=_activation(act),
                final_activation=final,
                use_bias=bias,
                scan=scan and depth >= 2,
                key=key(),
            )
            return Head(mlp)
        if kind == "custom":
            _, act, name, flag, scale, power, nothing, kinds = spec
            fields = {f"{k}{i}": _field_value(k, rng) for i, k in enumerate(kinds)}
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


def _data(seed: int) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(seed), (D,))
    return x, jnp.asarray(0.5, jnp.float32)


def assert_same_model(got: Any, want: Any) -> None:
    """The same structure (static fields included), equal arrays and equal other leaves."""
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def
    scale = _scale(want)
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if eqx.is_array(b):
            assert eqx.is_array(a), (i, a, b)
            _close(a, b, f"leaf {i}", scale)
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
    assert jax.tree.structure(got, is_leaf=_is_none) == jax.tree.structure(want, is_leaf=_is_none)
    got_leaves = jax.tree.leaves(got, is_leaf=_is_none)
    want_leaves = jax.tree.leaves(want, is_leaf=_is_none)
    scale = _scale(want)
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if b is None:
            assert a is None, (i, a)
        else:
            assert eqx.is_array(a), (i, a)
            _close(a, b, f"gradient leaf {i}", scale)


def _snapshot(model: Any) -> list:
    return jax.tree_util.tree_leaves(model)


def _shares(spec: tuple) -> bool:
    """Whether the model ``spec`` describes has a submodule at two places."""
    return spec[0] == "group" and (spec[4] or any(_shares(kid) for kid in spec[2]))


def _fresh_statics(model: Any) -> Any:
    """``model`` with every string and float leaf replaced by an equal but distinct object;
    one object at several places stays one (rule 7 tracks a string's identity: a string at
    two places and two equal strings there are two structures, traced apart)."""
    fresh: dict[int, Any] = {}

    def copy(x: Any) -> Any:
        if type(x) is str and x:
            return fresh.setdefault(id(x), "".join(["#", x])[1:])
        if type(x) is float:
            return fresh.setdefault(id(x), float(repr(x)))
        return x

    return jax.tree.map(copy, model)


@settings(max_examples=profiles.max_examples(5))
@given(spec=eqx_spec, seed=st.integers(0, 2**16))
def test_property_traced_arrays_training_step_is_filter_jit(spec, seed):
    """Two SGD steps: ``treeclone.jit(step, traced="arrays")`` under every policy against
    ``eqx.filter_jit(step)``; the second step runs on a model whose strings and floats are
    equal but distinct objects (a cache hit), and still gets the caller's objects back."""
    model = build(spec, seed)
    x, y = _data(seed)
    before = _snapshot(model)
    traces: list[str] = []

    def step(who: str) -> Callable:
        def counted(m: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
            traces.append(who)  # at trace time
            return sgd_step(m, x, y)

        return counted  # a function of its own: jit's caches are per function

    theirs = eqx.filter_jit(step("eqx"))
    want_loss, want = theirs(model, x, y)
    assert_statics_are(want, model)
    again = _fresh_statics(want)
    want_loss2, want2 = theirs(again, x, y)
    for policy in POLICIES:
        ours = tc.jit(step(policy), traced="arrays", policy=policy)
        loss, got = ours(model, x, y)
        _close(loss, want_loss, f"{policy}: loss", abs(float(want_loss)))
        assert_same_model(got, want)
        assert_statics_are(got, model)
        again = _fresh_statics(got)
        loss2, got2 = ours(again, x, y)
        _close(loss2, want_loss2, f"{policy}: second loss", abs(float(want_loss2)))
        assert_same_model(got2, want2)
        assert_statics_are(got2, again)
        # Equal statics: no new trace for them. The second call traces again where equinox's
        # does (an eqx.nn.PReLU's weakly typed slope comes back strongly typed, a new
        # signature for jax.jit) or where the first call's shared submodule came back as two
        # (rule 7: sharing is structure; apply_updates rebuilds each place).
        assert traces.count(policy) == max(traces.count("eqx"), 1 + _shares(spec))
        # Nothing is written into the caller's (immutable) model.
        assert all(a is b for a, b in zip(_snapshot(model), before, strict=True))


@settings(max_examples=profiles.max_examples(5))
@given(spec=eqx_spec, seed=st.integers(0, 2**16))
def test_property_wrt_arrays_is_filter_value_and_grad(spec, seed):
    """``value_and_grad`` and ``grad`` with ``wrt="arrays"`` (eager, under every policy, and
    inside ``jit(traced="arrays")``) against ``eqx.filter_value_and_grad`` and
    ``eqx.filter_grad``; ``eqx.apply_updates`` takes the gradient. No array at two places:
    ``test_an_array_at_two_places_gets_filter_grads_gradient_at_each``."""
    model = build(spec, seed, shared=False)
    x, y = _data(seed)
    before = _snapshot(model)
    want_loss, want = eqx.filter_value_and_grad(eqx_loss)(model, x, y)
    want_grad = eqx.filter_grad(eqx_loss)(model, x, y)
    want_model = eqx.apply_updates(model, want)
    for policy in POLICIES:
        loss, grads = tc.value_and_grad(eqx_loss, wrt="arrays", policy=policy)(model, x, y)
        _close(loss, want_loss, f"{policy}: value", abs(float(want_loss)))
        assert_same_grads(grads, want)
        assert_same_model(eqx.apply_updates(model, grads), want_model)
        assert_same_grads(tc.grad(eqx_loss, wrt="arrays", policy=policy)(model, x, y), want_grad)
    jitted = tc.jit(tc.value_and_grad(eqx_loss, wrt="arrays", policy="alias"), traced="arrays")
    loss, grads = jitted(model, x, y)
    _close(loss, want_loss, "jit: value", abs(float(want_loss)))
    assert_same_grads(grads, want)
    assert all(a is b for a, b in zip(_snapshot(model), before, strict=True))


def _shared_model() -> tuple:
    """One ``eqx.nn.Linear`` at two places of a tuple."""
    lin = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    return (lin, lin)


def _shared_loss(tree: tuple, x: jax.Array) -> jax.Array:
    return jnp.sum(2.0 * tree[0](x) + tree[1](x))


def test_an_array_at_two_places_under_clone_gets_filter_grads_gradient_at_each():
    """Rule 29 under clone: each place is its own input, as for jax.grad and
    eqx.filter_grad (the lift, which flattens with identity, is given the places untied)."""
    tree, x = _shared_model(), jnp.ones(2)
    want = eqx.filter_grad(_shared_loss)(tree, x)
    got = tc.grad(_shared_loss, wrt="arrays", policy="clone")(tree, x)
    assert_same_grads(got, want)
    assert tree[0] is tree[1]  # the caller's tie is left as it was


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_an_array_at_two_places_under_alias_and_strict_gets_its_total_gradient(policy):
    """Rule 29 under alias and strict: one array is one parameter (a tie), its gradient at
    each place the total, as plain Python's loss of the one object would have it."""
    tree, x = _shared_model(), jnp.ones(2)
    per_place = eqx.filter_grad(_shared_loss)(tree, x)
    total = jax.tree.map(lambda a, b: a + b, per_place[0], per_place[1])
    got = tc.grad(_shared_loss, wrt="arrays", policy=policy)(tree, x)
    assert_same_grads(got, (total, total))


def test_a_shared_submodule_trains_as_under_filter_jit():
    """The same shared Linear in a jitted step: the step's own ``eqx.filter_value_and_grad``
    gives each place its own gradient, and the results are ``eqx.filter_jit``'s."""
    tree, x = _shared_model(), jnp.ones(2)

    def step(t: tuple, x: jax.Array) -> tuple:
        loss, grads = eqx.filter_value_and_grad(_shared_loss)(t, x)
        return loss, eqx.apply_updates(t, jax.tree.map(lambda g: -LR * g, grads))

    want = eqx.filter_jit(step)(tree, x)
    for policy in POLICIES:
        assert_same_model(tc.jit(step, traced="arrays", policy=policy)(tree, x), want)


# --- nnx: generated modules ---------------------------------------------------------------------


class Count(nnx.Variable):
    """An integer counter: not a Param, never differentiated."""


class Scale(nnx.Variable):
    """A float Variable that is not a Param (differentiated only when ``wrt`` names it)."""


class Block(nnx.Module):
    def __init__(self, din: int, dout: int, norm: bool, drop: float, act: Any, rngs: nnx.Rngs):
        self.linear = nnx.Linear(din, dout, rngs=rngs)
        self.norm = nnx.BatchNorm(dout, momentum=0.8, rngs=rngs) if norm else None
        self.drop = nnx.Dropout(drop, rngs=rngs) if drop else None
        self.act = act

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.linear(x)
        if self.norm is not None:
            x = self.norm(x)
        x = self.act(x)
        if self.drop is not None:
            x = self.drop(x)
        return x


class NnxModel(nnx.Module):
    """Blocks (in an ``nnx.List`` or an ``nnx.Dict``), a head, an optional integer counter,
    a ``Scale`` gain and one thing at two places (``shared``): the head's bias Param, the
    gain, the counter, or the first block."""

    def __init__(self, spec: dict, rngs: nnx.Rngs):
        widths = [D, *spec["widths"]]
        if spec["shared"] == "block":
            widths[1] = D  # the shared block also maps its own output
        blocks = [
            Block(a, b, norm, drop, act, rngs)
            for a, b, (norm, drop, act) in zip(widths[:-1], widths[1:], spec["layers"], strict=True)
        ]
        if spec["container"] == "dict":
            self.blocks = nnx.Dict({f"b{i}": b for i, b in enumerate(blocks)})
        else:
            self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(widths[-1], 2, rngs=rngs)
        self.gain = Scale(jnp.asarray(1.5, jnp.float32))
        self.count = Count(jnp.asarray(0, jnp.int32)) if spec["counter"] else None
        self.first = blocks[0]
        shared = spec["shared"]
        if shared == "bias":
            self.tied = self.head.bias  # one Param, two attributes
        elif shared == "gain":
            self.first.gain = self.gain  # one Variable in two Modules
        elif shared == "count" and self.count is not None:
            self.first.count = self.count
        self.repeat = shared == "block"

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.count is not None:
            self.count[...] += 1
            if getattr(self.first, "count", None) is not None:
                self.first.count[...] += 2
        blocks = list(self.blocks.values() if isinstance(self.blocks, nnx.Dict) else self.blocks)
        if self.repeat:
            x = self.first(x)  # the first block twice
        for block in blocks:
            x = block(x)
        out = self.head(x) * self.gain[...]
        if hasattr(self, "tied"):
            out = out + self.tied[...]
        if hasattr(self.first, "gain"):
            out = out * self.first.gain[...]
        return out


def nnx_loss(model: NnxModel, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


nnx_layer = st.tuples(
    st.booleans(),  # BatchNorm
    st.sampled_from([0.0, 0.0, 0.3]),  # Dropout rate (0: none)
    st.sampled_from([jax.nn.relu, jnp.tanh, wiggle]),
)
nnx_spec = st.integers(1, 3).flatmap(
    lambda n: st.fixed_dictionaries(
        {
            "widths": st.lists(st.integers(1, 4), min_size=n, max_size=n),
            "layers": st.lists(nnx_layer, min_size=n, max_size=n),
            "container": st.sampled_from(["list", "dict"]),
            "counter": st.booleans(),
            "shared": st.sampled_from([None, "bias", "gain", "count", "block"]),
            "train": st.booleans(),
        }
    )
)
# The filters: named by a string in the examples (hypothesis prints it).
NNX_FILTERS = {
    "Param": nnx.Param,
    "All(Param, PathContains('head'))": nnx.All(nnx.Param, nnx.PathContains("head")),
    "All(Param, Not(PathContains('bias')))": nnx.All(nnx.Param, nnx.Not(nnx.PathContains("bias"))),
    "(Param, Scale)": (nnx.Param, Scale),
    "All(Any(OfType(Scale), PathContains('blocks')), Not(...))": nnx.All(
        nnx.Any(nnx.OfType(Scale), nnx.PathContains("blocks")),
        nnx.Not(nnx.Any(nnx.BatchStat, nnx.RngState, Count)),
    ),
}


def _nnx_pair(spec: dict, seed: int) -> tuple[NnxModel, NnxModel]:
    """The same model twice (same seeds): one for treeclone, one for nnx."""

    def make() -> NnxModel:
        model = NnxModel(spec, nnx.Rngs(seed, dropout=seed + 1))
        if not spec["train"]:
            model.eval()
        return model

    return make(), make()


def assert_same_state(got: Any, want: Any, what: str) -> None:
    """The same structure (State and Variable types included) and equal leaves."""
    assert jax.tree.structure(got) == jax.tree.structure(want), what
    scale = _scale(want)
    for i, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)):
        _close(a, b, f"{what}: leaf {i}", scale)


@settings(max_examples=profiles.max_examples(6))
@given(spec=nnx_spec, wrt_name=st.sampled_from(sorted(NNX_FILTERS)), seed=st.integers(0, 2**16))
def test_property_value_and_grad_with_an_nnx_filter_is_nnx_value_and_grad(spec, wrt_name, seed):
    wrt = NNX_FILTERS[wrt_name]
    model, reference = _nnx_pair(spec, seed)
    optimizer = nnx.Optimizer(model, optax.sgd(LR), wrt=wrt)
    ref_optimizer = nnx.Optimizer(reference, optax.sgd(LR), wrt=wrt)
    x = jax.random.normal(jax.random.key(seed), (4, D))
    y = jax.random.normal(jax.random.key(seed + 1), (4, 2))
    ours = tc.value_and_grad(nnx_loss, wrt=wrt, policy="alias")
    theirs = nnx.value_and_grad(nnx_loss, argnums=nnx.DiffState(0, wrt))
    for step in range(2):  # the second step sees the first one's updates
        loss, grads = ours(model, x, y)
        want_loss, want = theirs(reference, x, y)
        _close(loss, want_loss, f"step {step}: loss")
        assert isinstance(grads, nnx.State)
        assert_same_state(grads, want, f"step {step}: gradient")
        assert_same_state(nnx.state(model), nnx.state(reference), f"step {step}: after the call")
        optimizer.update(model, grads)
        ref_optimizer.update(reference, want)
        assert_same_state(nnx.state(model), nnx.state(reference), f"step {step}: after update")
    if spec["counter"]:  # 1 a call, and 2 more through its second name when shared
        assert int(model.count[...]) == 2 * (3 if spec["shared"] == "count" else 1)
