"""A policy per argument (docs/semantics.md, "A policy per argument"): ``policy=`` takes a dict
of policies by argument position and name, ``...`` for the rest. Each case is checked against
the plain-Python program run on copies of the same objects."""

from __future__ import annotations

import copy
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from treeclone.policies import ArgPolicies

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

from nnx_models import Block  # noqa: E402 - after the skips

PARAMS_ALIASED = {"params": "alias", ...: "clone"}


def _equal(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(
        np.allclose(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def _normalising_step(params, batch):
    batch["x"] = batch["x"] / 255  # in place: the cached batch must not see it
    params["w"] = params["w"] - 0.01 * jnp.sum(batch["x"] * params["w"])
    params["n"] = params["n"] + 1
    return jnp.sum(batch["x"])


def _batches():
    return [{"x": jnp.arange(3.0) * 255 * (i + 1)} for i in range(3)]


@pytest.mark.parametrize("mode", ["jit", "call"])
def test_epoch_loop_over_cached_batches_normalises_a_copy_and_writes_the_params(mode):
    batches = _batches()
    cached = copy.deepcopy(batches)
    params = {"w": jnp.ones(3), "n": jnp.zeros((), jnp.int32)}
    expected = copy.deepcopy(params)
    if mode == "jit":
        step = tc.jit(_normalising_step, policy=PARAMS_ALIASED)
    else:

        def step(p, b):
            return tc.call(_normalising_step, p, b, policy=PARAMS_ALIASED)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        for _ in range(3):
            for b in batches:
                step(params, b)
    for _ in range(3):  # plain Python, on fresh copies of the batches each step
        for b in cached:
            _normalising_step(expected, copy.deepcopy(b))
    assert _equal(batches, cached)  # the cached batches are unchanged after 3 epochs
    assert _equal(params, expected)
    assert int(params["n"]) == 9


@pytest.mark.parametrize("mode", ["jit", "call"])
def test_setdefault_on_a_cloned_config_leaves_the_callers_config_alone(mode):
    def step(params, cfg):
        cfg.setdefault("lr", 0.5)
        params["w"] = params["w"] * cfg["lr"]

    cfg: dict = {}
    params = {"w": jnp.ones(2)}
    expected = copy.deepcopy(params)
    step(expected, {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if mode == "jit":
            tc.jit(step, policy=PARAMS_ALIASED)(params, cfg)
        else:
            tc.call(step, params, cfg, policy=PARAMS_ALIASED)
    assert cfg == {}
    assert _equal(params, expected)
    # the discarded change of the cloned argument is reported, as under clone (rule J4)
    [warning] = [w for w in caught if w.category is tc.MutationWarning]
    assert "cfg: key added: 'lr'" in str(warning.message)


def _nnx_step(model, optimizer, batch):
    batch["x"] = batch["x"] * 2.0  # a cloned argument changed in place
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(batch["x"]) - batch["y"]) ** 2))(model)
    optimizer.update(model, grads)
    return loss


def test_nnx_model_and_optimizer_aliased_batch_cloned_equals_nnx_jit():
    model = Block(4, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    ref_model = nnx.clone(model)
    ref_optimizer = nnx.Optimizer(ref_model, optax.adam(1e-2), wrt=nnx.Param)
    key = jax.random.PRNGKey(1)
    batch = {"x": jax.random.normal(key, (8, 4)), "y": jnp.ones((8, 3))}
    kept = copy.deepcopy(batch)
    step = tc.jit(_nnx_step, policy={"model": "alias", "optimizer": "alias", ...: "clone"})
    ref_step = nnx.jit(_nnx_step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        for _ in range(3):
            loss = step(model, optimizer, batch)
            ref_loss = ref_step(ref_model, ref_optimizer, copy.deepcopy(kept))
            assert np.allclose(loss, ref_loss)
    assert _equal(batch, kept)
    state, ref_state = nnx.state((model, optimizer)), nnx.state((ref_model, ref_optimizer))
    assert _equal(state, ref_state)
    assert int(optimizer.step[...]) == 3


def test_strict_argument_changed_and_not_returned_raises_naming_it_caller_untouched():
    def step(params, stats):
        params["w"] = params["w"] + 1
        stats["count"] = stats["count"] + 1

    params, stats = {"w": jnp.zeros(2)}, {"count": jnp.zeros(())}
    jitted = tc.jit(step, policy={"params": "alias", "stats": "strict"})
    with pytest.raises(tc.MutationError, match=r"stats\['count'\]: replaced") as err:
        jitted(params, stats)
    assert "params" not in str(err.value)
    # the error comes before anything is written back: the caller is untouched
    assert _equal(params, {"w": jnp.zeros(2)}) and _equal(stats, {"count": jnp.zeros(())})


def test_strict_argument_returned_and_alias_argument_written_as_plain_python():
    def step(params, stats):
        params["w"] = params["w"] + 1
        stats["count"] = stats["count"] + 1
        return stats

    params, stats = {"w": jnp.zeros(2)}, {"count": jnp.zeros(())}
    expected_params, expected_stats = copy.deepcopy(params), copy.deepcopy(stats)
    expected_out = step(expected_params, copy.deepcopy(stats))
    for mode in ("jit", "call"):
        p = copy.deepcopy(params)
        if mode == "jit":
            out = tc.jit(step, policy={0: "alias", 1: "strict"})(p, stats)
        else:
            out = tc.call(step, p, stats, policy={0: "alias", 1: "strict"})
        assert _equal(p, expected_params)
        assert _equal(out, expected_out)
        assert out is not stats  # strict: fresh results, the caller's stats untouched
        assert _equal(stats, expected_stats)


def test_by_position_by_name_default_statics_and_kwargs():
    def step(a, n, b, *, c):
        for d in (a, b, c):
            d["v"] = d["v"] + n

    a, b, c = ({"v": jnp.zeros(())} for _ in range(3))
    # a by position, c by name, n static, b falls to ...: clone
    jitted = tc.jit(step, static_argnums=1, policy={0: "alias", "c": "alias", ...: "clone"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        jitted(a, 2, b, c=c)
        jitted(a=a, n=2, b=b, c=c)  # all by keyword: a is still aliased (its name)
    assert float(a["v"]) == 4.0 and float(c["v"]) == 4.0 and float(b["v"]) == 0.0
    # without ...: the rest is clone (jit's default); a negative position counts from the end
    spec = tc.jit(step, policy={-1: "alias"}).policy
    assert isinstance(spec, ArgPolicies) and dict(spec.names) == {"b": tc.ALIAS}
    assert spec.default is tc.CLONE
    # every argument one policy: that policy itself
    assert tc.jit(step, policy={"a": "alias", ...: "alias"}).policy is tc.ALIAS


def test_bad_specs_are_clear_errors_at_wrap_time():
    def step(params, batch):
        pass

    with pytest.raises(ValueError, match="'parms', which is not an argument of .*step"):
        tc.jit(step, policy={"parms": "alias"})
    with pytest.raises(ValueError, match="argument 2, but .*step .* has no such position"):
        tc.jit(step, policy={2: "alias"})
    with pytest.raises(ValueError, match=r"argument 0 \(params\) two policies"):
        tc.jit(step, policy={0: "alias", "params": "strict"})
    with pytest.raises(ValueError, match="unknown policy 'copy'"):
        tc.jit(step, policy={"params": "copy"})
    with pytest.raises(TypeError, match="policy's keys are argument positions"):
        tc.jit(step, policy={1.5: "alias"})
    with pytest.raises(ValueError, match="unknown policy"):
        tc.call(step, {}, {}, policy={"params": "nope"})


@pytest.mark.parametrize("mode", ["jit", "call"])
def test_a_container_shared_by_an_alias_and_a_clone_argument_is_an_error_naming_both(mode):
    def step(params, batch):
        params["w"] = params["w"] + 1

    shared = {"x": jnp.ones(2)}
    params = {"w": jnp.zeros(()), "data": shared}
    with pytest.raises(ValueError, match=r"params\['data'\] \(policy 'alias'\) is also at batch"):
        if mode == "jit":
            tc.jit(step, policy=PARAMS_ALIASED)(params, shared)
        else:
            tc.call(step, params, shared, policy=PARAMS_ALIASED)
    assert float(params["w"]) == 0.0
    # an array shared by both is fine: arrays are immutable
    tc.jit(step, policy=PARAMS_ALIASED)({"w": jnp.zeros(()), "x": shared["x"]}, shared)


@pytest.mark.parametrize("first", ["named", "unnamed"])
@pytest.mark.parametrize("mode", ["jit", "call"])
def test_a_container_a_named_argument_shares_with_an_unnamed_one_follows_the_named(mode, first):
    """Rule P5: a dict without ``...`` leaves the other arguments ``clone`` for the data no
    named argument holds; a container of theirs that an alias argument also holds is written
    back, as plain Python changes it, wherever it is met first."""

    def step(params, batch):
        batch["x"] = batch["x"] * 2
        params["w"] = params["w"] + 1
        return batch["x"].sum()

    def run(params, batch, fun=step):
        if first == "unnamed":
            fun = lambda batch, params: step(params, batch)  # noqa: E731
            args = (batch, params)
        else:
            args = (params, batch)
        if mode == "jit":
            return tc.jit(fun, policy={"params": "alias"})(*args)
        return tc.call(fun, *args, policy={"params": "alias"})

    shared = {"x": jnp.ones(2)}
    params = {"w": jnp.zeros(()), "data": shared}
    plain_shared = {"x": np.ones(2)}
    plain = {"w": np.zeros(()), "data": plain_shared}
    for _ in range(2):
        assert float(run(params, shared)) == float(step(plain, plain_shared))
        assert _equal(params, plain) and params["data"] is shared


def test_jit_partial_takes_a_policy_per_argument():
    def step(params, batch):
        batch["x"] = batch["x"] / 2
        params["w"] = params["w"] + jnp.sum(batch["x"])

    params = {"w": jnp.zeros(())}
    batch = {"x": jnp.full((2,), 4.0)}
    expected = copy.deepcopy(params)
    # the bound params are aliased (jit_partial's default for what is not named)
    bound = tc.jit_partial(step, params, policy={"batch": "clone"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        for _ in range(3):
            bound(batch)
            step(expected, copy.deepcopy({"x": jnp.full((2,), 4.0)}))
    assert _equal(params, expected) and _equal(batch, {"x": jnp.full((2,), 4.0)})
    # a bound argument left alone stays as it was, and calls after see it so
    counts = {"n": jnp.zeros(())}

    def count(counts, params):
        counts["n"] = counts["n"] + 1
        params["w"] = params["w"] + counts["n"]

    p = {"w": jnp.zeros(())}
    bound2 = tc.jit_partial(count, counts, policy={"counts": "clone", ...: "alias"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        bound2(p)
        bound2(p)
    assert float(counts["n"]) == 0.0 and float(p["w"]) == 2.0


def test_policy_context_and_with_policy_override_the_spec():
    def step(params, batch):
        batch.append(1.0)
        params.append(1.0)

    jitted = tc.jit(step, policy=PARAMS_ALIASED)
    params, batch = [], []
    with tc.policy("alias"):
        jitted(params, batch)
    assert len(params) == 1 and len(batch) == 1
    jitted.with_policy("alias")(params, batch)
    assert len(params) == 2 and len(batch) == 2
    assert jitted.with_policy({"batch": "alias", ...: "clone"}).policy == ArgPolicies(
        ((1, tc.ALIAS),), (("batch", tc.ALIAS),), tc.CLONE
    )


def test_call_with_numpy_arrays_writes_only_the_alias_arguments_arrays():
    def bump(a, b):
        a += 1
        b += 1

    a, b = np.zeros(2), np.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.MutationWarning)
        tc.call(bump, a, b, policy={"a": "alias", ...: "clone"})
    assert a.tolist() == [1.0, 1.0] and b.tolist() == [0.0, 0.0]
    with pytest.raises(tc.MutationError, match="b: array changed in place"):
        tc.call(bump, a, b, policy={"a": "alias", "b": "strict"})
    assert a.tolist() == [1.0, 1.0] and b.tolist() == [0.0, 0.0]
