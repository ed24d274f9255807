"""The ahead-of-time stages keep the policy (docs/semantics.md, "Ahead of time"):
``jitted.lower(...)``, ``.trace(...)`` and ``.compile()`` under alias, strict, a policy per
argument and ``traced=`` give stages whose call is the jitted call (write-back, strict's arrays,
static leaves put back, identity), checked against flax nnx's compiled stages, equinox's and
jax.jit's on the same steps; introspection is JAX's, in the user's structure; a call with
arguments of another structure, sharing or static value is a TypeError saying what differs."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import treeclone as tc

nnx = pytest.importorskip("flax.nnx")

STEPS = 3


def _same(a: Any, b: Any) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


# --- flax nnx: a training step that updates the model and optimizer in place --------------------


def _nnx_setup() -> tuple[Any, Any, jax.Array, jax.Array]:
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    y = jnp.linspace(0.0, 1.0, 8).reshape(4, 2)
    return model, optimizer, x, y


def _nnx_step(model: Any, optimizer: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    def loss_fn(m: Any) -> jax.Array:
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


NNX_POLICIES = ["alias", {"model": "alias", "optimizer": "alias", ...: "strict"}]


@pytest.mark.parametrize("policy", NNX_POLICIES, ids=["alias", "per-argument"])
@pytest.mark.parametrize("stage", ["compile", "trace"])
def test_a_compiled_nnx_step_updates_the_model_as_nnx_compiled_does(policy: Any, stage: str):
    """``nnx.jit(step).lower(...).compile()``'s call runs nnx's graph update: the model and
    the optimizer change in place. treeclone's compiled (and traced) stage does the same."""
    model, optimizer, x, y = _nnx_setup()
    compiled = nnx.jit(_nnx_step).lower(model, optimizer, x, y).compile()
    theirs = [compiled(model, optimizer, x, y) for _ in range(STEPS)]

    ours_model, ours_optimizer, x, y = _nnx_setup()
    kernel = ours_model.kernel  # the caller's own Variable objects are updated in place
    traced = tc.jit(_nnx_step, policy=policy).trace(ours_model, ours_optimizer, x, y)
    run = traced if stage == "trace" else traced.lower().compile()
    ours = [run(ours_model, ours_optimizer, x, y) for _ in range(STEPS)]

    _same(ours, theirs)
    _same(nnx.state(ours_model), nnx.state(model))
    _same(nnx.state(ours_optimizer), nnx.state(optimizer))
    assert ours_model.kernel is kernel
    assert int(ours_optimizer.step[...]) == STEPS


def test_jit_partial_lower_updates_the_bound_state_as_nnx_jit_partial_does():
    model, optimizer, x, y = _nnx_setup()
    partial = nnx.jit_partial(_nnx_step, model, optimizer, graph=False)
    compiled = partial.lower(x, y).compile()
    theirs = [compiled(x, y) for _ in range(STEPS)]

    ours_model, ours_optimizer, x, y = _nnx_setup()
    step = tc.jit_partial(_nnx_step, ours_model, ours_optimizer)
    ours_compiled = step.lower(x, y).compile()
    ours = [ours_compiled(x, y) for _ in range(STEPS)]
    _same(ours, theirs)
    _same(nnx.state(ours_model), nnx.state(model))
    # The bound arguments' cache followed the compiled calls: a call of the partial agrees.
    _same(step(x, y), compiled(x, y))
    _same(nnx.state(ours_model), nnx.state(model))


# --- plain Python state, under every policy, against jax.jit's compiled ------------------------


def _dict_step(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
    state["n"] = state["n"] + 1
    state["w"] = state["w"] - 0.1 * x
    return state, (state["w"] * x).sum()


def _state() -> dict:
    return {"n": jnp.zeros((), jnp.int32), "w": jnp.ones(3)}


@pytest.mark.parametrize("policy", ["clone", "alias", "strict", {"state": "alias", ...: "strict"}])
def test_a_compiled_step_does_what_the_jitted_call_does(policy: Any) -> None:
    """Each compiled call returns the jitted call's result, and leaves the caller's objects as
    the jitted call leaves them (alias: written back; clone and strict: the state returned)."""
    x = jnp.arange(3.0)
    expected_state, called = _state(), tc.jit(_dict_step, policy=policy)
    state = _state()
    compiled = tc.jit(_dict_step, policy=policy).lower(state, x).compile()
    for _ in range(STEPS):
        want = called(expected_state, x)
        got = compiled(state, x)
        _same(got, want)
        assert (got[0] is state) == (want[0] is expected_state)
    _same(state, expected_state)
    reference = jax.jit(_dict_step).lower(_state(), x).compile()(_state(), x)
    _same(tc.jit(_dict_step, policy=policy).lower(_state(), x).compile()(_state(), x), reference)


def test_strict_reports_at_lower_and_hands_back_jax_arrays() -> None:
    def leaky(state: dict) -> jax.Array:
        state["w"] = state["w"] + 1
        return state["w"].sum()

    with pytest.raises(tc.MutationError, match=r"state\['w'\]: replaced"):
        tc.jit(leaky, policy="strict").lower({"w": jnp.zeros(3)})

    def identity(state: dict) -> dict:
        return state

    compiled = tc.jit(identity, policy="strict").lower({"w": np.zeros(3)}).compile()
    out = compiled({"w": np.ones(3)})
    assert isinstance(out["w"], jax.Array)  # strict gives jax.jit's results
    alias = tc.jit(identity, policy="alias").lower({"w": np.zeros(3)}).compile()
    given = {"w": np.ones(3)}
    assert alias(given) is given  # alias gives plain Python's


# --- equinox: traced="arrays" against eqx.filter_jit's stages -----------------------------------


class _Net(eqx.Module):
    linear: eqx.nn.Linear
    act: Any
    name: str

    def __init__(self, key: jax.Array):
        self.linear = eqx.nn.Linear(3, 2, key=key)
        self.act = jax.nn.softplus
        self.name = "net"

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(jax.vmap(self.linear)(x))


def _eqx_step(model: _Net, opt_state: Any, x: jax.Array) -> tuple[Any, Any, Any, str]:
    loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state)
    return eqx.apply_updates(model, updates), opt_state, loss, model.name


@pytest.mark.parametrize("policy", ["clone", "alias", "strict", {"model": "strict", ...: "alias"}])
def test_traced_arrays_compiled_equals_filter_jit_compiled(policy: Any) -> None:
    model = _Net(jax.random.PRNGKey(0))
    opt_state = optax.sgd(0.1).init(eqx.filter(model, eqx.is_array))
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    theirs_compiled = eqx.filter_jit(_eqx_step).lower(model, opt_state, x).compile()
    ours_compiled = (
        tc.jit(_eqx_step, policy=policy, traced="arrays").lower(model, opt_state, x).compile()
    )
    theirs = ours = (model, opt_state)
    for _ in range(STEPS):
        *theirs_out, theirs_loss, theirs_name = theirs_compiled(*theirs, x)
        *ours_out, ours_loss, ours_name = ours_compiled(*ours, x)
        theirs, ours = tuple(theirs_out), tuple(ours_out)
        _same(ours_loss, theirs_loss)
        assert ours_name == theirs_name == "net"  # a static output comes back as it is
        assert ours[0].act is jax.nn.softplus  # a static leaf, as it is
    _same(eqx.filter(ours, eqx.is_array), eqx.filter(theirs, eqx.is_array))
    shapes = tc.jit(_eqx_step, policy=policy, traced="arrays").eval_shape(model, opt_state, x)
    assert shapes[3] == "net" and shapes[2].shape == ()


def test_traced_arrays_under_alias_writes_back_and_keeps_static_leaves() -> None:
    def step(model: dict, x: jax.Array) -> jax.Array:
        model["w"] = model["act"](model["w"] + x)
        return model["w"].sum()

    model = {"w": jnp.zeros(2), "act": jnp.tanh}
    compiled = tc.jit(step, policy="alias", traced="arrays").lower(model, 1.0).compile()
    expected = {"w": jnp.zeros(2), "act": jnp.tanh}
    for _ in range(STEPS):
        _same(compiled(model, 1.0), step(expected, 1.0))
    _same(model["w"], expected["w"])
    assert model["act"] is jnp.tanh


# --- introspection, in the user's structure ------------------------------------------------------


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_introspection_is_jax_s_in_the_user_s_structure(policy: str) -> None:
    def f(params: dict, x: jax.Array, n: int) -> dict:
        return {"y": params["w"] * x * n, "z": [x.sum()]}

    args = ({"w": jnp.ones(3)}, jnp.arange(3.0), 2)
    ours_jit = tc.jit(f, policy=policy, static_argnums=2)
    theirs_jit = jax.jit(f, static_argnums=2)
    ours, theirs = ours_jit.lower(*args), theirs_jit.lower(*args)
    assert "jit_f" in ours.as_text()
    assert ours.compiler_ir() is not None
    # JAX's own, whatever the backend gives (None on a TPU before compiling).
    assert (ours.cost_analysis() is None) == (theirs.cost_analysis() is None)
    assert ours.out_tree == theirs.out_tree
    assert ours.in_tree == theirs.in_tree
    assert ours.args_info == theirs.args_info
    assert ours.in_avals == theirs.in_avals
    compiled = ours.compile()
    assert compiled.out_tree == theirs.compile().out_tree
    assert compiled.memory_analysis() is not None and compiled.cost_analysis() is not None
    assert "jit_f" in compiled.as_text()
    traced = ours_jit.trace(*args)
    assert traced.out_info == theirs_jit.trace(*args).out_info
    assert traced.fun_name == "f" and traced.jaxpr is not None
    # Static arguments were fixed at lower: the compiled call takes the others, as jax.jit's.
    _same(compiled(args[0], args[1]), theirs.compile()(args[0], args[1]))


def test_donation_is_reported_on_the_user_s_argument() -> None:
    def f(state: dict, x: jax.Array) -> dict:
        return {"w": state["w"] + x}

    lowered = tc.jit(f, policy="alias", donate_argnums=0).lower({"w": jnp.ones(3)}, jnp.ones(3))
    (state, x), _ = lowered.args_info
    assert state["w"].donated and not x.donated
    theirs = jax.jit(f, donate_argnums=0).lower({"w": jnp.ones(3)}, jnp.ones(3))
    assert lowered.donate_argnums == theirs.donate_argnums == (0,)


# --- a call of another structure, sharing or static value --------------------------------------


def _compiled(policy: Any = "alias", **options: Any) -> Any:
    def step(state: dict, x: Any) -> jax.Array:
        state["w"] = state["w"] + x
        return state["w"].sum()

    return tc.jit(step, policy=policy, **options).lower({"w": jnp.zeros(2)}, jnp.ones(2)).compile()


def test_another_structure_is_a_type_error_saying_what_differs() -> None:
    compiled = _compiled()
    with pytest.raises(TypeError, match=r"(?s)step was traced.*\* state: key added: 'v'"):
        compiled({"w": jnp.zeros(2), "v": jnp.zeros(2)}, jnp.ones(2))
    state = {"w": jnp.zeros(2)}
    with pytest.raises(TypeError, match=r"(?s)\* x: now the same object as state\['w'\]"):
        compiled(state, state["w"])  # sharing is part of what was compiled
    np.testing.assert_allclose(state["w"], 0.0)  # nothing ran, nothing was written


def test_another_static_value_is_a_type_error_saying_what_differs() -> None:
    def step(state: dict, x: jax.Array) -> jax.Array:
        return state["act"](x).sum()

    jitted = tc.jit(step, policy="alias", traced="arrays")
    compiled = jitted.lower({"act": jnp.tanh}, jnp.ones(2)).compile()
    _same(compiled({"act": jnp.tanh}, jnp.ones(2)), jnp.tanh(jnp.ones(2)).sum())
    with pytest.raises(TypeError, match=r"state\['act'\]: static leaf changed"):
        compiled({"act": jnp.sin}, jnp.ones(2))

    def scaled(x: jax.Array, n: int) -> jax.Array:
        return x * n

    fixed = tc.jit(scaled, policy="alias", static_argnames="n").lower(jnp.ones(2), n=3).compile()
    _same(fixed(jnp.ones(2)), jnp.full(2, 3.0))
    with pytest.raises(TypeError, match="static argument 'n' was fixed"):
        fixed(jnp.ones(2), n=3)


def test_a_stage_called_with_too_few_arguments_says_what_differs() -> None:
    def scaled(x: jax.Array, n: int, y: jax.Array) -> jax.Array:
        return x * n + y

    compiled = tc.jit(scaled, policy="alias", static_argnums=1)
    compiled = compiled.lower(jnp.ones(2), 3, jnp.ones(2)).compile()
    _same(compiled(jnp.ones(2), jnp.ones(2)), jnp.full(2, 4.0))
    with pytest.raises(TypeError, match="(?s)scaled was traced.*not static"):
        compiled(jnp.ones(2))


def test_a_stage_names_an_argument_given_by_keyword_where_it_was_positional() -> None:
    """jax.jit's Compiled refuses an argument given by keyword that was positional when it was
    lowered, naming ``args`` and ``kwargs``; treeclone's names the argument and how it was
    given then and now (the key paths and types alone are the same)."""

    def step(state: dict, x: jax.Array) -> jax.Array:
        return (state["w"] * x).sum()

    args = ({"w": jnp.ones(2)}, jnp.ones(2))
    with pytest.raises(TypeError, match="kwargs"):
        jax.jit(step).lower(*args).compile()(args[0], x=args[1])
    compiled = tc.jit(step, policy="alias").lower(*args).compile()
    with pytest.raises(TypeError, match=r"\* x: now given by keyword \(before: by position\)"):
        compiled(args[0], x=args[1])
    keyword = tc.jit(step, policy="alias").lower(args[0], x=args[1]).compile()
    with pytest.raises(TypeError, match=r"\* x: now given by position \(before: by keyword\)"):
        keyword(*args)


def test_a_stage_names_a_node_s_old_and_new_static_data() -> None:
    """A registered node whose static data differs: the key path, and the data before and
    now (as jax.jit's Compiled says what it saw and what it is given)."""

    def step(state: dict) -> jax.Array:
        return state["w"].sum()

    compiled = tc.jit(step, policy="alias").lower({"w": jnp.ones(2), "p": Mode("train")})
    compiled = compiled.compile()
    with pytest.raises(
        TypeError,
        match=r"\* state\['p'\]: Mode's static data changed from 'train' to 'eval'",
    ):
        compiled({"w": jnp.ones(2), "p": Mode("eval")})


def test_a_stage_says_both_structures_where_no_key_path_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where no key path, type, sharing or static value tells the two calls apart, the message
    prints the structure the stage was made for and the one it was given (never only "the
    arguments' structure")."""
    from treeclone import _retrace

    monkeypatch.setattr(_retrace, "call_differences", lambda *_: [])
    compiled = _compiled()
    with pytest.raises(TypeError) as info:
        compiled({"w": jnp.zeros(2), "v": jnp.zeros(2)}, jnp.ones(2))
    message = str(info.value)
    assert "the arguments' structure changed from PyTreeDef(" in message
    assert "{'w': *}" in message and "{'v': *, 'w': *}" in message


@jax.tree_util.register_pytree_node_class
class Mode:
    """A node with no children and its mode as static data."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def tree_flatten(self) -> tuple[tuple, str]:
        return (), self.mode

    @classmethod
    def tree_unflatten(cls, mode: str, children: tuple) -> Mode:
        return cls(mode)
