"""The rules of docs/semantics.md, one test (or a few) per rule, each named in the doc.

Every rule runs through ``treeclone.jit`` and, where the rule is not about compilation, through
the eager ``treeclone.call`` too; ``clone`` rules are checked against ``jax.jit`` itself, and
``alias`` rules against the same function run without jit (plain Python).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

# --- fixtures: the seed's pattern -------------------------------------------------------------


@jax.tree_util.register_pytree_node_class
class Optimizer:
    """The seed discussion's optimizer: ``update`` mutates it in place (SGD with momentum)."""

    def __init__(self, lr, momentum, count):
        self.lr = lr
        self.momentum = momentum
        self.count = count

    def tree_flatten(self):
        return (self.momentum, self.count), self.lr

    @classmethod
    def tree_unflatten(cls, lr, children):
        return cls(lr, *children)

    def update(self, grads, params):
        self.momentum = jax.tree.map(lambda m, g: 0.9 * m + g, self.momentum, grads)
        self.count = self.count + 1
        return jax.tree.map(lambda p, m: p - self.lr * m, params, self.momentum)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
    params: dict


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def train_step(model, x, y, optimizer):
    loss, grads = jax.value_and_grad(loss_fn)(model.params, x, y)
    model.params = optimizer.update(grads, model.params)
    return model, loss, optimizer


def train_step_no_return(model, x, y, optimizer):
    """The same step, relying on the in-place updates alone."""
    loss, grads = jax.value_and_grad(loss_fn)(model.params, x, y)
    model.params = optimizer.update(grads, model.params)
    return loss


def make_state(seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    params = {
        "w1": jax.random.normal(k[0], (4, 8)) * 0.5,
        "b1": jnp.zeros(8),
        "w2": jax.random.normal(k[1], (8, 2)) * 0.5,
    }
    opt = Optimizer(0.05, jax.tree.map(jnp.zeros_like, params), jnp.array(0))
    x = jax.random.normal(k[2], (16, 4))
    y = jax.random.normal(k[3], (16, 2))
    return Model(params), x, y, opt


def runner(mode, fun, policy):
    """``fun`` under ``policy``, jitted or run eagerly."""
    if mode == "jit":
        return tc.jit(fun, policy=policy)
    return lambda *a, **k: tc.call(fun, *a, policy=policy, **k)


MODES = ["jit", "call"]


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


# --- clone ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_clone_caller_untouched(mode):
    model, x, y, opt = make_state()
    before_params, before_count = model.params, opt.count
    before_keys = dict(model.params)
    out = runner(mode, train_step, "clone")(model, x, y, opt)
    assert model.params is before_params and model.params == before_keys
    assert opt.count is before_count
    new_model, _, new_opt = out
    assert int(new_opt.count) == 1


@pytest.mark.parametrize("mode", MODES)
def test_clone_returns_fresh_objects(mode):
    model, x, y, opt = make_state()
    new_model, _, new_opt = runner(mode, train_step, "clone")(model, x, y, opt)
    assert new_model is not model and new_opt is not opt
    assert new_model.params is not model.params

    # an input handed back untouched: fresh containers all the way down, and new arrays
    model, _, _, opt = make_state()
    state = {"model": model, "opt": opt, "table": np.arange(3.0)}
    out = runner(mode, lambda s: s, "clone")(state)
    assert out is not state and out["model"] is not model and out["opt"] is not opt
    assert out["model"].params is not model.params and out["opt"].momentum is not opt.momentum
    inputs, outputs = jax.tree.leaves(state), jax.tree.leaves(out)
    leaves_equal(outputs, inputs)
    if mode == "jit":  # every leaf a new jax.Array, as jax.jit gives
        reference = jax.tree.leaves(jax.jit(lambda s: s)(state))
        for leaves in (outputs, reference):
            assert all(isinstance(o, jax.Array) for o in leaves)
            assert not {id(o) for o in leaves} & {id(i) for i in inputs}
    else:  # no computation: a NumPy array is a copy (rule J28), a jax.Array (immutable) itself
        assert out["table"] is not state["table"]
        assert out["opt"].count is opt.count


def test_clone_equals_jax_jit():
    model, x, y, opt = make_state()
    expected = jax.jit(train_step)(*make_state())
    got = tc.jit(train_step)(model, x, y, opt)
    leaves_equal(got, expected)
    assert jax.tree.structure(got) == jax.tree.structure(expected)


def test_clone_is_jax_jit_for_non_returned_mutation():
    """Under clone (and jax.jit) a mutation that is not returned is lost."""
    model, x, y, opt = make_state()
    count = opt.count
    tc.jit(train_step_no_return)(model, x, y, opt)
    assert opt.count is count
    model2, x2, y2, opt2 = make_state()
    jax.jit(train_step_no_return)(model2, x2, y2, opt2)
    assert int(opt2.count) == int(opt.count) == 0


# --- alias ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_alias_returned_input_is_callers_object(mode):
    model, x, y, opt = make_state()
    new_model, _, new_opt = runner(mode, train_step, "alias")(model, x, y, opt)
    assert new_opt is opt and new_model is model
    assert int(opt.count) == 1


@pytest.mark.parametrize("mode", MODES)
def test_alias_non_returned_mutation_propagates(mode):
    model, x, y, opt = make_state()
    plain_model, px, py, plain_opt = make_state()
    train_step_no_return(plain_model, px, py, plain_opt)  # plain Python, no jit
    runner(mode, train_step_no_return, "alias")(model, x, y, opt)
    leaves_equal(model.params, plain_model.params)
    leaves_equal(opt.momentum, plain_opt.momentum)
    assert int(opt.count) == int(plain_opt.count) == 1


@pytest.mark.parametrize("mode", MODES)
def test_alias_container_mutations(mode):
    """Item set, key added and removed, append, attribute set: as plain Python."""

    def f(d, lst, model):
        d["a"] = d["a"] * 2
        d["new"] = jnp.ones(1)
        del d["gone"]
        lst.append(lst[0] + 1)
        model.params = {"p": model.params["p"] + 1}
        return None

    def state():
        return (
            {"a": jnp.ones(2), "gone": jnp.zeros(1), "keep": jnp.zeros(3)},
            [jnp.zeros(2)],
            Model({"p": jnp.zeros(2)}),
        )

    d, lst, model = state()
    keep = d["keep"]
    pd, plst, pmodel = state()
    f(pd, plst, pmodel)
    out = runner(mode, f, "alias")(d, lst, model)
    assert out is None
    assert list(d) == list(pd) == ["a", "keep", "new"]
    assert d["keep"] is keep
    leaves_equal((d, lst, model.params), (pd, plst, pmodel.params))


@pytest.mark.parametrize("mode", MODES)
def test_dict_keys_are_seen_sorted_and_the_callers_order_is_kept(mode):
    """Under alias the function sees a dict's keys sorted, as under jax.jit; the caller's dict
    keeps its kept keys in their places and gets the new ones after them."""
    seen = []

    def f(d):
        seen.append(list(d))
        d["c"] = d["a"] + 1
        d["b"] = d["b"] * 2
        del d["d"]

    def state():
        return {"d": jnp.ones(1), "b": jnp.ones(1), "a": jnp.zeros(1)}

    d, plain = state(), state()
    f(plain)
    seen.clear()
    runner(mode, f, "alias")(d)
    assert seen == [["a", "b", "d"]]
    assert list(d) == list(plain) == ["b", "a", "c"]
    leaves_equal(d, plain)


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_optax_loop_compiles_once(policy):
    """Issue 12, target 4: params built in any key order, updated by ``optax.apply_updates``
    (which returns dicts in sorted key order) and handed back in: one trace, as under jax.jit,
    whether the step returns its state or (alias) updates the caller's dict in place."""
    optax = pytest.importorskip("optax")
    opt = optax.adam(1e-2)
    traces = []

    def loss(params, x):
        return jnp.sum((x @ params["w2"] + params["b"]) ** 2) + jnp.sum(params["w1"] ** 2)

    def step(params, opt_state, x):
        traces.append(None)
        grads = jax.grad(loss)(params, x)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss(params, x)

    params = {"w2": jnp.ones((3, 2)), "w1": jnp.ones(2), "b": jnp.zeros(2)}  # not sorted
    opt_state = opt.init(params)
    x = jnp.ones((4, 3))
    jitted = tc.jit(step, policy=policy)
    for _ in range(3):
        params, opt_state, _ = jitted(params, opt_state, x)
    assert len(traces) == 1 and jitted._cache_size() == 1

    def step_in_place(state, x):
        traces.append(None)
        state["params"], state["opt"], value = step(state["params"], state["opt"], x)
        return value

    if policy == "alias":
        traces.clear()
        state = {"params": {"w2": jnp.ones((3, 2)), "w1": jnp.ones(2), "b": jnp.zeros(2)}}
        state["opt"] = opt.init(state["params"])
        in_place = tc.jit(step_in_place, policy="alias")
        for _ in range(3):
            in_place(state, x)
        assert len(traces) == 2 and in_place._cache_size() == 1  # step_in_place runs step


@pytest.mark.parametrize("mode", MODES)
def test_a_key_deleted_and_added_back_keeps_its_place(mode):
    """The function never saw the caller's order, so a key it deletes and adds back is a key it
    kept: it stays where it was in the caller's dict (plain Python would move it to the end)."""

    def f(d):
        d["a"] = d["b"] + 1
        old = d.pop("b")
        d["b"] = old

    d = {"b": jnp.zeros(2), "c": jnp.zeros(2)}
    runner(mode, f, "alias")(d)
    assert list(d) == ["b", "c", "a"]
    leaves_equal(d, {"b": jnp.zeros(2), "c": jnp.zeros(2), "a": jnp.ones(2)})


@pytest.mark.parametrize("mode", MODES)
def test_alias_list_grows(mode):
    def f(history, x):
        history.append(x * 2)
        history.append({"nested": [x]})
        return len(history)

    history = [jnp.zeros(1)]
    runner(mode, f, "alias")(history, jnp.ones(1))
    assert len(history) == 3
    np.testing.assert_allclose(history[1], 2.0)
    assert isinstance(history[2], dict) and isinstance(history[2]["nested"], list)


@pytest.mark.parametrize("mode", MODES)
def test_alias_unchanged_leaf_is_not_materialized(mode):
    def f(params):
        return {"frozen": params["frozen"], "trained": params["trained"] + 1}

    params = {"frozen": jnp.ones(3), "trained": jnp.zeros(3)}
    out = runner(mode, f, "alias")(params)
    assert out["frozen"] is params["frozen"]
    jout = jax.jit(f)(params)
    assert jout["frozen"] is not params["frozen"]  # jax.jit hands back a new array


def test_alias_unchanged_python_values_are_handed_back():
    """Not only arrays: an input value returned untouched is the caller's object, as in plain
    Python (jax.jit, and strict, hand back a new jax.Array: rule J15,
    tests/policies/test_strict_outputs.py)."""
    scalar, host = 2.0, np.arange(3.0)
    out = tc.jit(lambda x, s, h: (x * 2, s, h), policy="alias")(jnp.ones(2), scalar, host)
    assert out[1] is scalar and out[2] is host
    assert isinstance(jax.jit(lambda s: s)(scalar), jax.Array)


def test_alias_donated_container_is_consumed_as_under_jax_jit():
    """A donated dict argument the function does not change: its arrays are not outputs of the
    computation (so XLA can reuse their buffers for the results), the caller's dict keeps the
    same array objects, and those are deleted exactly when jax.jit deletes them."""

    def f(d):
        return d["p"] * 2

    def run(jit):
        p, q = jnp.arange(3.0), jnp.ones(2)
        d = {"p": p, "q": q}
        out = jit(f, donate_argnums=0)(d)
        np.testing.assert_allclose(out, 2 * np.arange(3.0))
        assert d["p"] is p and d["q"] is q
        return p.is_deleted(), q.is_deleted()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Some donated buffers were not usable"
        expected = run(jax.jit)
        assert run(lambda fun, **kw: tc.jit(fun, policy="alias", **kw)) == expected


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_same_array_twice_is_one_input(policy):
    seen = []

    def f(a, b):
        seen.append(a is b)
        return a + b

    x = jnp.arange(3.0)
    tc.jit(f, policy=policy)(x, x)
    jax.jit(f)(x, x)
    assert seen == [True, False]  # treeclone: the same object; jax.jit: two tracers


def test_identity_checks_inside_function():
    def f(tree):
        return jnp.asarray(tree["a"] is tree["b"], dtype=jnp.int32)

    shared = [jnp.ones(2)]
    tree = {"a": shared, "b": shared}
    assert int(tc.jit(f, policy="alias")(tree)) == 1
    assert int(tc.jit(f, policy="strict")(tree)) == 1
    assert int(tc.jit(f, policy="clone")(tree)) == int(jax.jit(f)(tree)) == 0
    assert int(f(tree)) == 1  # plain Python


@pytest.mark.parametrize("mode", MODES)
def test_alias_tied_weights(mode):
    """A shared sub-container: a write through one path is seen through the other."""

    def f(model):
        model["encoder"]["w"] = model["encoder"]["w"] + 1
        return model["decoder"]["w"]

    embed = {"w": jnp.zeros(2)}
    model = {"encoder": embed, "decoder": embed}
    out = runner(mode, f, "alias")(model)
    assert model["encoder"] is model["decoder"] is embed
    np.testing.assert_allclose(embed["w"], 1.0)
    np.testing.assert_allclose(out, 1.0)  # as plain Python: the decoder is the encoder


@pytest.mark.parametrize("mode", MODES)
def test_alias_raises_midway_leaves_caller_untouched(mode):
    def f(d, lst):
        d["x"] = d["x"] + 1
        lst.append(1)
        raise RuntimeError("midway")

    d, lst = {"x": jnp.zeros(1)}, [jnp.zeros(1)]
    x0 = d["x"]
    with pytest.raises(RuntimeError, match="midway"):
        runner(mode, f, "alias")(d, lst)
    assert d == {"x": x0} and d["x"] is x0 and len(lst) == 1


class Guarded:
    """A custom node whose in-place update can be made to fail."""

    fail = False

    def __init__(self, v):
        self.v = v


jax.tree_util.register_pytree_node(
    Guarded, lambda g: ((g.v,), None), lambda _, children: Guarded(*children)
)


def _guarded_update(target, source):
    if Guarded.fail:
        raise OSError("cannot write")
    target.v = source.v


tc.register_inplace(Guarded, _guarded_update)


@pytest.mark.parametrize("mode", MODES)
def test_alias_writeback_is_all_or_nothing(mode):
    def f(a, g, b):
        a["x"] = a["x"] + 1
        g.v = g.v + 1
        b.append(jnp.ones(1))
        return None

    a, g, b = {"x": jnp.zeros(1)}, Guarded(jnp.zeros(1)), [jnp.zeros(1)]
    snapshot = (dict(a), g.v, list(b))
    Guarded.fail = True
    try:
        with pytest.raises(OSError, match="cannot write"):
            runner(mode, f, "alias")(a, g, b)
    finally:
        Guarded.fail = False
    assert a == snapshot[0] and g.v is snapshot[1] and b == snapshot[2]
    runner(mode, f, "alias")(a, g, b)
    np.testing.assert_allclose(g.v, 1.0)
    assert len(b) == 2


def test_alias_register_inplace_hook_is_used():
    calls = []

    class Box:
        def __init__(self, v):
            self.v = v

    jax.tree_util.register_pytree_node(Box, lambda b: ((b.v,), None), lambda _, c: Box(*c))

    def update(target, source):
        calls.append(1)
        target.v = source.v

    tc.register_inplace(Box, update)
    box = Box(jnp.zeros(1))

    def f(b):
        b.v = b.v + 1

    tc.jit(f, policy="alias")(box)
    assert calls and float(box.v[0]) == 1.0


def test_alias_ten_steps_equal_plain_python():
    """The issue's acceptance check: ten jitted steps under alias == ten plain steps."""
    model, x, y, opt = make_state()
    model_id, opt_id = id(model), id(opt)
    step = tc.jit(train_step, policy="alias")
    for _ in range(10):
        out_model, _, out_opt = step(model, x, y, opt)
        assert out_model is model and out_opt is opt
    plain_model, px, py, plain_opt = make_state()
    for _ in range(10):
        train_step(plain_model, px, py, plain_opt)
    assert id(model) == model_id and id(opt) == opt_id
    leaves_equal(model.params, plain_model.params)
    leaves_equal(opt.momentum, plain_opt.momentum)
    assert int(opt.count) == int(plain_opt.count) == 10


def test_alias_ten_steps_without_return_equal_plain_python():
    """Variant 2 of the seed's pattern: the step returns only the loss, and the caller's own
    model and optimizer end as ten plain steps leave them."""
    model, x, y, opt = make_state()
    step = tc.jit(train_step_no_return, policy="alias")
    plain_model, px, py, plain_opt = make_state()
    # the step replaces these dicts (it builds new ones): the caller's old ones are left as
    # they were, in plain Python and under alias
    first = (model.params, opt.momentum, dict(model.params), dict(opt.momentum))
    plain_first = (plain_model.params, plain_opt.momentum)
    for _ in range(10):
        loss = step(model, x, y, opt)
        plain_loss = train_step_no_return(plain_model, px, py, plain_opt)
        np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    assert plain_model.params is not plain_first[0] and plain_opt.momentum is not plain_first[1]
    assert model.params is not first[0] and opt.momentum is not first[1]
    for old, items in ((first[0], first[2]), (first[1], first[3])):  # the same arrays as before
        assert old.keys() == items.keys() and all(old[k] is items[k] for k in items)
    leaves_equal(model.params, plain_model.params)
    leaves_equal(opt.momentum, plain_opt.momentum)
    assert int(opt.count) == int(plain_opt.count) == 10
    assert not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((model, opt)))


# --- strict -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_strict_non_returned_mutation_is_an_error(mode):
    model, x, y, opt = make_state()
    params, count = model.params, opt.count
    with pytest.raises(tc.MutationError) as info:
        runner(mode, train_step_no_return, "strict")(model, x, y, opt)
    message = str(info.value)
    assert "optimizer.count" in message and "model.params" in message
    assert model.params is params and opt.count is count


@pytest.mark.parametrize("mode", MODES)
def test_strict_returned_mutation_is_allowed(mode):
    model, x, y, opt = make_state()
    params = model.params
    new_model, _, new_opt = runner(mode, train_step, "strict")(model, x, y, opt)
    assert new_opt is not opt and new_model is not model  # fresh, as under clone
    assert model.params is params and int(opt.count) == 0
    assert int(new_opt.count) == 1


@pytest.mark.parametrize(
    "body, fragment",
    [
        (lambda d, lst: d.__setitem__("k", d["k"] + 1), "d['k']: replaced"),
        (lambda d, lst: d.__setitem__("new", 1.0), "d: key added: 'new'"),
        (lambda d, lst: d.pop("k"), "d: key removed: 'k'"),
        (lambda d, lst: lst.append(1.0), "lst: list resized from 1 to 2"),
    ],
)
def test_strict_names_each_kind_of_mutation(body, fragment):
    def f(d, lst):
        body(d, lst)
        return 0

    with pytest.raises(tc.MutationError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        tc.jit(f, policy="strict")({"k": jnp.zeros(1)}, [jnp.zeros(1)])


def test_strict_pure_function_passes():
    f = tc.jit(lambda p: jax.tree.map(lambda x: x * 2, p), policy="strict")
    leaves_equal(f({"a": jnp.ones(2)}), {"a": 2 * jnp.ones(2)})


# --- all policies -----------------------------------------------------------------------------


def _restructure(d, lst, x):
    """Structure changes only: a key added, a key deleted, a list grown."""
    d["new"] = x * 2
    del d["gone"]
    lst.append(x + 1)
    return x


def _restructure_state(v):
    return {"keep": jnp.full(1, v), "gone": jnp.zeros(1)}, [jnp.full(1, v)]


def _items(d, lst):
    """What the containers hold, by identity."""
    return [(k, id(v)) for k, v in d.items()], [id(x) for x in lst]


def test_structure_changes_are_mutations_replayed_at_every_cached_call():
    """Rule J18: written back under alias, discarded under clone, an error under strict; the
    change the one trace recorded is replayed, with each call's values, at every later call
    of the same structure."""
    traces = []

    def f(d, lst, x):
        traces.append(1)
        return _restructure(d, lst, x)

    step = tc.jit(f, policy="alias")
    for v in (1.0, 2.0, 3.0):
        (d, lst), (plain_d, plain_lst) = _restructure_state(v), _restructure_state(v)
        keep, first = d["keep"], lst[0]
        step(d, lst, jnp.full(1, v))
        _restructure(plain_d, plain_lst, jnp.full(1, v))
        assert list(d) == list(plain_d) == ["keep", "new"] and len(lst) == len(plain_lst) == 2
        leaves_equal((d, lst), (plain_d, plain_lst))
        assert d["keep"] is keep and lst[0] is first
    assert len(traces) == 1

    clone = tc.jit(f)
    for v in (1.0, 2.0):
        d, lst = _restructure_state(v)
        before = _items(d, lst)
        clone(d, lst, jnp.full(1, v))
        assert _items(d, lst) == before  # nothing written
    assert len(traces) == 2

    strict = tc.jit(f, policy="strict")
    for v in (1.0, 2.0):  # the trace raised: nothing cached, the next call raises again
        d, lst = _restructure_state(v)
        before = _items(d, lst)
        with pytest.raises(tc.MutationError) as info:
            strict(d, lst, jnp.full(1, v))
        for line in ("d: key added: 'new'", "d: key removed: 'gone'", "lst: list resized"):
            assert line in str(info.value), info.value
        assert _items(d, lst) == before


# --- donation, policy selection -------------------------------------------------------------


def test_alias_donation_of_buffer_appearing_twice():
    """An array in two donated arguments is one input, donated once: it is deleted after the
    call, as jax.jit deletes the array of the function written with it once; jax.jit itself
    fails on f(x, x) with both donated (tests/jit/test_jit_conformance.py)."""

    def f(a, b):
        return a + b

    x = jnp.arange(4.0)
    out = tc.jit(f, policy="alias", donate_argnums=(0, 1))(x, x)
    np.testing.assert_allclose(out, 2 * np.arange(4.0))
    assert x.is_deleted()
    y = jnp.arange(4.0)
    np.testing.assert_allclose(jax.jit(lambda a: f(a, a), donate_argnums=0)(y), out)
    assert y.is_deleted()


def test_alias_donation_shared_with_kept_argument_is_not_donated():
    """A leaf in a donated and in a non-donated argument is kept (the caller still has it)."""

    def f(a, b):
        return a * 2, b

    x = jnp.arange(4.0)
    out, same = tc.jit(f, policy="alias", donate_argnums=0)(x, x)
    assert not x.is_deleted()
    assert same is x
    np.testing.assert_allclose(out, 2 * np.arange(4.0))


def test_policy_context_manager_and_with_policy():
    calls = []

    def f(d):
        calls.append(1)
        d["n"] = d["n"] + 1

    jitted = tc.jit(f)  # clone by default
    d = {"n": jnp.zeros(())}
    jitted(d)
    assert float(d["n"]) == 0.0
    with tc.policy("alias"):
        jitted(d)
    assert float(d["n"]) == 1.0
    jitted.with_policy("alias")(d)
    assert float(d["n"]) == 2.0
    with pytest.raises(tc.MutationError):
        jitted.with_policy("strict")(d)
    with tc.policy("clone"):
        jitted.with_policy("alias")(d)  # the context manager overrides
    assert float(d["n"]) == 2.0


def test_policy_objects():
    assert tc.Policy("propagate", "preserve") == tc.ALIAS
    assert tc.Policy("propagate", "preserve").name == "alias"
    with pytest.raises(ValueError, match="needs identity='preserve'"):
        tc.Policy("propagate", "duplicate")
    with pytest.raises(ValueError, match="unknown policy"):
        tc.jit(lambda x: x, policy="bogus")
    custom = tc.Policy("discard", "preserve")
    d = {"x": jnp.zeros(1)}

    def f(d):
        d["x"] = d["x"] + 1
        return d["x"]

    out = tc.jit(f, policy=custom)(d)
    assert float(d["x"][0]) == 0.0 and float(out[0]) == 1.0


def test_alias_deepcopy_of_state_is_unaffected():
    """Write-back touches the caller's objects only, never copies made before the call."""
    model, x, y, opt = make_state()
    saved = copy.copy(opt)
    tc.jit(train_step, policy="alias")(model, x, y, opt)
    assert int(saved.count) == 0 and int(opt.count) == 1
