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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import profiles
import pytest
import treeclone as tc
from hypothesis import given, settings
from hypothesis import strategies as st

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

from eqx_models import (  # noqa: E402 - after the skips
    LR,
    D,
    assert_same_grads,
    assert_same_model,
    assert_statics_are,
    build,
    close,
    data,
    eqx_loss,
    eqx_spec,
    scale_of,
    sgd_step,
    wiggle,
)

# A change treeclone would discard (none is made here) must not pass silently.
pytestmark = pytest.mark.filterwarnings("error::treeclone.MutationWarning")

POLICIES = ["clone", "alias", "strict"]


def _snapshot(model: Any) -> list:
    return jax.tree_util.tree_leaves(model)


def _shares(spec: tuple) -> bool:
    """Whether the model ``spec`` describes has a submodule at two places."""
    return spec[0] == "group" and (spec[4] or any(_shares(kid) for kid in spec[2]))


def _fresh_statics(model: Any) -> Any:
    """``model`` with every string and float leaf replaced by an equal but distinct object;
    one object at several places stays one (rule J8 tracks a string's identity: a string at
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
    x, y = data(seed)
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
        close(loss, want_loss, f"{policy}: loss", abs(float(want_loss)))
        assert_same_model(got, want)
        assert_statics_are(got, model)
        again = _fresh_statics(got)
        loss2, got2 = ours(again, x, y)
        close(loss2, want_loss2, f"{policy}: second loss", abs(float(want_loss2)))
        assert_same_model(got2, want2)
        assert_statics_are(got2, again)
        # Equal statics: no new trace for them. The second call traces again where equinox's
        # does (an eqx.nn.PReLU's weakly typed slope comes back strongly typed, a new
        # signature for jax.jit) or where the first call's shared submodule came back as two
        # (rule J8: sharing is structure; apply_updates rebuilds each place).
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
    x, y = data(seed)
    before = _snapshot(model)
    want_loss, want = eqx.filter_value_and_grad(eqx_loss)(model, x, y)
    want_grad = eqx.filter_grad(eqx_loss)(model, x, y)
    want_model = eqx.apply_updates(model, want)
    for policy in POLICIES:
        loss, grads = tc.value_and_grad(eqx_loss, wrt="arrays", policy=policy)(model, x, y)
        close(loss, want_loss, f"{policy}: value", abs(float(want_loss)))
        assert_same_grads(grads, want)
        assert_same_model(eqx.apply_updates(model, grads), want_model)
        assert_same_grads(tc.grad(eqx_loss, wrt="arrays", policy=policy)(model, x, y), want_grad)
    jitted = tc.jit(tc.value_and_grad(eqx_loss, wrt="arrays", policy="alias"), traced="arrays")
    loss, grads = jitted(model, x, y)
    close(loss, want_loss, "jit: value", abs(float(want_loss)))
    assert_same_grads(grads, want)
    assert all(a is b for a, b in zip(_snapshot(model), before, strict=True))


def _shared_model() -> tuple:
    """One ``eqx.nn.Linear`` at two places of a tuple."""
    lin = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    return (lin, lin)


def _shared_loss(tree: tuple, x: jax.Array) -> jax.Array:
    return jnp.sum(2.0 * tree[0](x) + tree[1](x))


def test_an_array_at_two_places_under_clone_gets_filter_grads_gradient_at_each():
    """Rule G4 under clone: each place is its own input, as for jax.grad and
    eqx.filter_grad (the lift, which flattens with identity, is given the places untied)."""
    tree, x = _shared_model(), jnp.ones(2)
    want = eqx.filter_grad(_shared_loss)(tree, x)
    got = tc.grad(_shared_loss, wrt="arrays", policy="clone")(tree, x)
    assert_same_grads(got, want)
    assert tree[0] is tree[1]  # the caller's tie is left as it was


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_an_array_at_two_places_under_alias_and_strict_gets_its_total_gradient(policy):
    """Rule G4 under alias and strict: one array is one parameter (a tie), its gradient at
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
    scale = scale_of(want)
    for i, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)):
        close(a, b, f"{what}: leaf {i}", scale)


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
        close(loss, want_loss, f"step {step}: loss")
        assert isinstance(grads, nnx.State)
        assert_same_state(grads, want, f"step {step}: gradient")
        assert_same_state(nnx.state(model), nnx.state(reference), f"step {step}: after the call")
        optimizer.update(model, grads)
        ref_optimizer.update(reference, want)
        assert_same_state(nnx.state(model), nnx.state(reference), f"step {step}: after update")
    if spec["counter"]:  # 1 a call, and 2 more through its second name when shared
        assert int(model.count[...]) == 2 * (3 if spec["shared"] == "count" else 1)
