"""``treeclone.scan``, ``fori_loop`` and ``while_loop`` under each policy (docs/semantics.md,
"scan, fori_loop and while_loop"): ``clone`` against the JAX loop; ``alias`` against the plain
Python loop run un-transformed on NumPy copies of the same objects (values, container
identity); ``strict`` against the MutationError; every error names the key path and leaves
the caller untouched."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc
from treeclone._jax_compat import DebugInfo

XS = jnp.arange(5.0)


def python_scan(f, carry, xs, reverse=False):
    """The loop ``scan`` stands for, on NumPy: slices of each leaf, ys stacked."""
    n = len(jax.tree.leaves(xs)[0])
    order = range(n - 1, -1, -1) if reverse else range(n)
    ys = [None] * n
    for i in order:
        carry, ys[i] = f(carry, jax.tree.map(lambda a, i=i: a[i], xs))
    stacked = None if ys[0] is None else jax.tree.map(lambda *v: np.stack(v), *ys)
    return carry, stacked


def numpy_copy(tree):
    return jax.tree.map(np.asarray, copy.deepcopy(tree))


def assert_close(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


# --- the motivating example: an optimizer object stepped inside scan ------------------------------


@jax.tree_util.register_pytree_node_class
class Momentum:
    """An optimizer that updates itself (its velocity and step count) in place."""

    def __init__(self, lr, velocity, count):
        self.lr, self.velocity, self.count = lr, velocity, count

    def update(self, grads, params):
        self.count = self.count + 1
        self.velocity = {k: 0.9 * self.velocity[k] + grads[k] for k in grads}
        for k in params:  # the params dict too, in place
            params[k] = params[k] - self.lr * self.velocity[k]

    def tree_flatten(self):
        return (self.velocity, self.count), self.lr

    @classmethod
    def tree_unflatten(cls, lr, children):
        return cls(lr, *children)


def loss_fn(params, x):
    return jnp.sum((x * params["w"] + params["b"] - 1.0) ** 2)


def train_body(carry, x):
    params, opt = carry
    loss, grads = jax.value_and_grad(loss_fn)(params, x)
    opt.update(grads, params)
    return carry, loss


def _train_state():
    params = {"w": jnp.array([0.5, -0.2]), "b": jnp.zeros(2)}
    opt = Momentum(0.05, {"w": jnp.zeros(2), "b": jnp.zeros(2)}, jnp.zeros((), jnp.int32))
    return params, opt


def test_optimizer_object_stepped_inside_scan_updates_the_callers_objects():
    params, opt = _train_state()
    carry = (params, opt)
    xs = jnp.linspace(0.0, 1.0, 12).reshape(6, 2)
    out, losses = tc.scan(train_body, carry, xs, policy="alias")
    # the Python loop, on NumPy copies of the same objects
    np_params, np_opt = numpy_copy(_train_state())
    py_carry, py_losses = python_scan(
        lambda c, x: (lambda loss_grads: (c[1].update(loss_grads[1], c[0]), (c, loss_grads[0]))[1])(
            jax.value_and_grad(loss_fn)(c[0], x)
        ),
        (np_params, np_opt),
        np.asarray(xs),
    )
    assert out is carry and out[0] is params and out[1] is opt  # the caller's objects
    assert int(opt.count) == 6 == int(np_opt.count)
    assert_close(params, np_params)
    assert_close(opt.velocity, np_opt.velocity)
    np.testing.assert_allclose(losses, py_losses, rtol=1e-5)
    assert not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((params, opt)))


def test_optimizer_in_scan_inside_jit_alias_compiles_once_and_matches_jax_lax_scan():
    traces = []

    @tc.jit(policy="alias")
    def epoch(params, opt, xs):
        traces.append(1)
        return tc.scan(train_body, (params, opt), xs, policy="alias")[1]

    params, opt = _train_state()
    # JAX's own loop of the same steps: jax.lax.scan hands the body fresh containers, which it
    # updates and returns, so the carry threads the optimizer's state functionally
    reference = _train_state()
    xs = jnp.linspace(0.0, 1.0, 8).reshape(4, 2)
    for _ in range(2):
        losses = epoch(params, opt, xs)
        reference, expected = jax.lax.scan(train_body, reference, xs)
        np.testing.assert_allclose(losses, expected, rtol=1e-6)
    assert len(traces) == 1
    ref_params, ref_opt = reference
    assert_close(params, ref_params)
    assert_close(opt.velocity, ref_opt.velocity)
    assert int(opt.count) == int(ref_opt.count) == 8
    assert not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((params, opt)))


# --- clone: the JAX loops themselves ------------------------------------------------------------


def test_clone_is_the_jax_loop_and_leaves_the_caller_alone():
    def body(c, x):
        c["t"] = c["t"] + x  # discarded, as under jax.lax.scan
        return c, x * 2

    state = {"t": jnp.zeros(())}
    ours = tc.scan(body, state, XS, reverse=True, unroll=2)
    theirs = jax.lax.scan(body, {"t": jnp.zeros(())}, XS, reverse=True, unroll=2)
    assert_close(ours, theirs)
    assert ours[0] is not state and float(state["t"]) == 0.0
    assert str(jax.make_jaxpr(lambda s: tc.scan(body, s, XS))(state)) == str(
        jax.make_jaxpr(lambda s: jax.lax.scan(body, s, XS))(state)
    )
    fb = lambda i, c: (c[0] + i, c[1] * 2)  # noqa: E731
    assert tc.fori_loop(0, 4, fb, (0, 1.0)) == jax.lax.fori_loop(0, 4, fb, (0, 1.0))
    cond, wb = (lambda c: c < 10), (lambda c: c + 3)
    assert tc.while_loop(cond, wb, 0) == jax.lax.while_loop(cond, wb, 0)
    with tc.policy("clone"):
        assert tc.scan(body, state, XS, policy="alias")[0] is not state


# --- alias: the Python loop ---------------------------------------------------------------------


def test_alias_scan_in_place_body_returns_the_callers_carry():
    def body(c, x):
        c["t"] = c["t"] + x
        c["hist"][0] = c["hist"][0] * 0.5 + x
        return c, {"y": x * c["t"]}

    state = {"t": jnp.zeros(()), "hist": [jnp.ones(())], "fixed": jnp.arange(3.0)}
    hist, fixed = state["hist"], state["fixed"]
    out, ys = tc.scan(body, state, XS, policy="alias")
    ref = {"t": np.zeros(()), "hist": [np.ones(())], "fixed": np.arange(3.0)}
    ref_out, ref_ys = python_scan(body, ref, np.asarray(XS))
    assert out is state and state["hist"] is hist and ref_out is ref
    assert state["fixed"] is fixed  # untouched leaves are handed back, not copied
    assert_close(state, ref)
    assert_close(ys, ref_ys)


@pytest.mark.parametrize("reverse", [False, True])
def test_alias_scan_functional_body_returns_a_new_carry_and_leaves_init(reverse):
    def body(c, x):
        return {"t": c["t"] * 0.5 + x, "n": c["n"] + 1}, c["t"]

    state = {"t": jnp.zeros(()), "n": jnp.zeros((), jnp.int32)}
    out, ys = tc.scan(body, state, XS, reverse=reverse, unroll=3, policy="alias")
    ref_out, ref_ys = python_scan(body, numpy_copy(state), np.asarray(XS), reverse=reverse)
    assert out is not state and float(state["t"]) == 0.0 and int(state["n"]) == 0
    assert_close(out, ref_out)
    assert_close(ys, ref_ys)


def test_alias_scan_mixed_carry_keeps_each_containers_identity_as_python():
    # A new tuple around the caller's dict (updated in place) and a new list each iteration.
    def body(c, x):
        params, buf = c
        params["w"] = params["w"] + x
        return (params, [buf[0] + 1.0]), None

    params, buf = {"w": jnp.zeros(2)}, [jnp.zeros(())]
    carry = (params, buf)
    out, ys = tc.scan(body, carry, XS, policy="alias")
    ref = ({"w": np.zeros(2)}, [np.zeros(())])
    ref_out, _ = python_scan(body, ref, np.asarray(XS))
    assert ys is None
    assert out is not carry and out[0] is params and out[1] is not buf  # as in Python:
    assert ref_out[0] is ref[0] and ref_out[1] is not ref[1]
    assert_close(out, ref_out)
    assert float(buf[0]) == 0.0


def test_alias_scan_length_without_xs_and_shared_containers_stay_shared():
    shared = {"v": jnp.ones(())}

    def body(c, _):
        c["a"]["v"] = c["a"]["v"] * 2  # through one name: the other sees it
        return c, c["b"]["v"]

    state = {"a": shared, "b": shared}
    out, ys = tc.scan(body, state, None, length=3, policy="alias")
    assert out is state and state["a"] is state["b"] is shared
    assert float(shared["v"]) == 8.0
    np.testing.assert_array_equal(ys, [2.0, 4.0, 8.0])


def test_alias_fori_loop_and_while_loop_are_the_python_loops():
    def body(i, acc):
        acc["sum"] = acc["sum"] + i
        acc["sq"].append(acc["sq"].pop() + i * i)
        return acc

    acc = {"sum": jnp.zeros((), jnp.int32), "sq": [jnp.zeros((), jnp.int32)]}
    assert tc.fori_loop(2, 7, body, acc, unroll=2, policy="alias") is acc
    ref = {"sum": np.int32(0), "sq": [np.int32(0)]}
    for i in range(2, 7):
        ref = body(i, ref)
    assert_close(acc, ref)

    def halve(s):
        s["x"] = s["x"] / 2
        s["steps"] = s["steps"] + 1
        return s

    state = {"x": jnp.array(100.0), "steps": jnp.zeros((), jnp.int32)}
    assert tc.while_loop(lambda s: s["x"] > 1.0, halve, state, policy="alias") is state
    ref = {"x": np.float32(100.0), "steps": np.int32(0)}
    while ref["x"] > 1.0:
        ref = halve(ref)
    assert_close(state, ref)


def test_alias_fori_loop_with_traced_bounds_inside_jit():
    @tc.jit(policy="alias")
    def run(state, n):
        def body(i, s):
            s["t"] = s["t"] + i
            return s

        tc.fori_loop(0, n, body, state, policy="alias")

    state = {"t": jnp.zeros((), jnp.int32)}
    run(state, 4)
    run(state, 3)
    assert int(state["t"]) == 6 + 3


def test_alias_python_scalars_in_the_carry_come_back_as_arrays():
    state = {"n": 0, "x": 1.5}

    def body(c, _):
        c["n"] = c["n"] + 1
        return c, None

    tc.scan(body, state, None, length=4, policy="alias")
    assert int(state["n"]) == 4 and state["x"] == 1.5 and isinstance(state["x"], float)


def test_grad_through_alias_scan_is_jax_grad_of_the_functional_loop():
    def loss(w, stats):
        def body(c, x):
            c["acc"] = c["acc"] + jnp.sin(w * x)
            c["calls"] = c["calls"] + 1
            return c, jnp.cos(w * x)

        _, ys = tc.scan(body, stats, XS, policy="alias")
        return stats["acc"] + jnp.sum(ys)

    stats = {"acc": jnp.zeros(()), "calls": jnp.zeros(())}
    g = tc.grad(loss, policy="alias")(1.3, stats)
    want = jax.grad(lambda w: jnp.sum(jnp.sin(w * XS)) + jnp.sum(jnp.cos(w * XS)))(1.3)
    np.testing.assert_allclose(g, want, rtol=1e-5)
    assert float(stats["calls"]) == 5.0
    assert not isinstance(stats["acc"], jax.core.Tracer)
    np.testing.assert_allclose(stats["acc"], jnp.sum(jnp.sin(1.3 * XS)), rtol=1e-6)


def test_nested_alias_loops():
    def inner(c, x):
        c["t"] = c["t"] + x
        return c, None

    def outer(c, xs):
        tc.scan(inner, c, xs, policy="alias")
        c["rows"] = c["rows"] + 1
        return c, None

    state = {"t": jnp.zeros(()), "rows": jnp.zeros(())}
    tc.scan(outer, state, jnp.ones((3, 4)), policy="alias")
    assert float(state["t"]) == 12.0 and float(state["rows"]) == 3.0


# --- strict ---------------------------------------------------------------------------------------


def test_strict_unreturned_carry_mutation_is_a_mutation_error_naming_the_path():
    def body(c, x):
        c["opt"]["count"] = c["opt"]["count"] + 1
        return {"opt": {"count": c["opt"]["count"]}}, None

    state = {"opt": {"count": jnp.zeros(())}}
    with pytest.raises(tc.MutationError, match=r"init\['opt'\]\['count'\]: replaced") as raised:
        tc.scan(body, state, XS, policy="strict")
    assert float(state["opt"]["count"]) == 0.0
    # The remedy it offers is true: alias does not apply this body's change either (L6).
    assert "under policy 'alias' this body is a ValueError too" in str(raised.value)
    with pytest.raises(ValueError, match="without returning the changed container"):
        tc.scan(body, state, XS, policy="alias")


def test_strict_in_place_and_returned_is_fine_and_the_caller_is_not_written():
    def body(c, x):
        c["t"] = c["t"] + x
        return c, None

    state = {"t": jnp.zeros(())}
    out, _ = tc.scan(body, state, XS, policy="strict")
    assert out is not state and float(out["t"]) == 10.0 and float(state["t"]) == 0.0
    assert tc.fori_loop(0, 3, lambda i, c: body(c, i)[0], state, policy="strict")["t"] == 3.0


def python_scan_over_views(f, carry, xs, reverse=False):
    """The loop ``scan`` stands for under alias, on NumPy: each slice is a view of row i of
    the stacked ``xs``, so what the body leaves in it is row i of each leaf afterwards."""
    n = len(jax.tree.leaves(xs)[0])
    ys = [None] * n
    for i in range(n - 1, -1, -1) if reverse else range(n):
        x = jax.tree.map(lambda a, i=i: a[i], xs)
        carry, ys[i] = f(carry, x)
        for stacked, row in zip(jax.tree.leaves(xs), jax.tree.leaves(x), strict=True):
            stacked[i] = row  # the view's write
    stacked = None if ys[0] is None else jax.tree.map(lambda *v: np.stack(v), *ys)
    return carry, stacked


def writable_copy(tree):
    return jax.tree.map(np.array, copy.deepcopy(tree))  # np.array: a writable copy


def counting_body(c, x):
    x["count"] = x["count"] + 1  # in place on the slice: row i of xs['count']
    x["sub"]["k"] = x["sub"]["k"] * c["t"] + x["w"]
    c["t"] = c["t"] + x["w"]
    return c, x["count"] * 2


def stacked_xs():
    return {
        "count": jnp.zeros(4, jnp.int32),
        "w": jnp.arange(1.0, 5.0),
        "sub": {"k": jnp.ones((4, 2))},
    }


@pytest.mark.parametrize("reverse", [False, True])
def test_alias_scan_writes_what_the_body_does_to_its_slice_back_into_xs(reverse):
    xs, state = stacked_xs(), {"t": jnp.ones(())}
    sub, w = xs["sub"], xs["w"]
    twin_xs, twin_state = writable_copy(xs), numpy_copy(state)
    out, ys = tc.scan(counting_body, state, xs, reverse=reverse, policy="alias")
    want_out, want_ys = python_scan_over_views(counting_body, twin_state, twin_xs, reverse)
    assert out is state
    assert_close(xs, twin_xs)  # every row written, in the order the loop ran
    assert_close(state, want_out)
    assert_close(ys, want_ys)
    assert xs["sub"] is sub and xs["w"] is w  # the caller's containers; w never changed
    assert not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(xs))


def test_alias_scan_writes_the_slice_back_inside_jit_and_for_a_shared_array():
    @tc.jit(policy="alias")
    def run(state, xs):
        tc.scan(counting_body, state, xs, policy="alias")

    xs, state = stacked_xs(), {"t": jnp.ones(())}
    twin_xs, twin_state = writable_copy(xs), numpy_copy(state)
    run(state, xs)
    python_scan_over_views(counting_body, twin_state, twin_xs)
    assert_close(xs, twin_xs)
    assert_close(state, twin_state)

    shared = jnp.zeros(3)  # one array at two places of xs: one carried leaf, as for the carry

    def both(c, x):
        x["a"] = x["a"] + 1
        x["b"] = x["a"]  # the two places keep one value
        return c, None

    xs = {"a": shared, "b": shared}
    tc.scan(both, None, xs, policy="alias")
    np.testing.assert_array_equal(xs["a"], [1.0, 1.0, 1.0])
    assert xs["a"] is xs["b"]


def test_xs_slices_under_strict_are_an_error_unless_returned_and_clone_leaves_xs_alone():
    def body(c, x):
        x["a"] = x["a"] * 100
        c["t"] = c["t"] + x["a"]
        return c, None

    xs = {"a": XS}
    with pytest.raises(tc.MutationError, match=r"xs\['a'\]: replaced") as raised:
        tc.scan(body, {"t": jnp.zeros(())}, xs, policy="strict")
    # What strict offers instead is what alias does.
    assert "policy='alias', which writes what the body leaves in each slice back" in str(
        raised.value
    )
    assert xs["a"] is XS
    state = {"t": jnp.zeros(())}
    tc.scan(body, state, xs, policy="alias")
    assert float(state["t"]) == 1000.0
    np.testing.assert_array_equal(xs["a"], np.asarray(XS) * 100)

    xs = {"a": XS}
    out, _ = tc.scan(body, {"t": jnp.zeros(())}, xs)  # clone: JAX's loop, the caller alone
    assert float(out["t"]) == 1000.0 and xs == {"a": XS} and xs["a"] is XS

    def returned(c, x):  # strict: returned in ys, so allowed, and xs is not written
        x["a"] = x["a"] + 1
        return c, x

    xs = {"a": XS}
    _, ys = tc.scan(returned, None, xs, policy="strict")
    assert xs["a"] is XS
    np.testing.assert_array_equal(ys["a"], np.asarray(XS) + 1)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda x: x.update(extra=x["a"]), ValueError, r"added xs\['extra'\]"),
        (lambda x: x["l"].append(x["a"]), ValueError, r"added xs\['l'\]\[1\]"),
        (lambda x: x.update(a=x["a"][None]), TypeError, r"float32\[1\] at xs\['a'\] of its slice"),
        (
            lambda x: (x["l"].append(1.0), x.update(l=[x["a"]])),
            ValueError,
            r"xs\['l'\]: list resized",
        ),
    ],
)
def test_a_slice_whose_structure_or_types_change_is_an_error_naming_the_key(change, error, match):
    def body(c, x):
        x["a"] = x["a"] + 1  # a change that would be written back ...
        change(x)  # ... but this one cannot be
        return c, None

    a, lst = jnp.arange(3.0), [jnp.ones(3)]
    xs = {"a": a, "l": lst}
    with pytest.raises(error, match=match):
        tc.scan(body, None, xs, policy="alias")
    assert xs == {"a": a, "l": lst} and xs["a"] is a and xs["l"] is lst and len(lst) == 1


def test_zero_length_and_a_failed_write_back_leave_xs_as_they_were():
    xs = {"count": jnp.zeros(0, jnp.int32), "w": jnp.zeros(0), "sub": {"k": jnp.zeros((0, 2))}}
    count = xs["count"]
    tc.scan(counting_body, {"t": jnp.ones(())}, xs, policy="alias")
    assert xs["count"] is count

    class Refuses:
        def __init__(self, v):
            self.v = v

    jax.tree_util.register_pytree_node(Refuses, lambda r: ((r.v,), None), lambda _, c: Refuses(*c))
    tc.register_inplace(Refuses, lambda target, source: (_ for _ in ()).throw(RuntimeError("no")))

    def body(c, x):
        c["t"] = c["t"] + 1  # written first, then undone with xs's writes
        x["a"] = x["a"] + 1
        x["r"].v = x["r"].v + 1
        return c, None

    a = jnp.zeros(3)
    state, xs = {"t": jnp.zeros(())}, {"a": a, "r": Refuses(jnp.zeros(3))}
    with pytest.raises(RuntimeError, match="no"):
        tc.scan(body, state, xs, policy="alias")
    assert float(state["t"]) == 0.0 and xs["a"] is a and float(xs["r"].v.sum()) == 0.0


# --- errors: clear, named, caller untouched ----------------------------------------------


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_a_body_that_changes_the_carrys_structure_is_an_error_naming_the_key(policy):
    def body(c, x):
        c["t"] = c["t"] + x
        c["extra"] = x
        return c, None

    state = {"t": jnp.zeros(())}
    with pytest.raises(ValueError, match=r"added init\['extra'\]"):
        tc.scan(body, state, XS, policy=policy)
    assert list(state) == ["t"] and float(state["t"]) == 0.0

    def grow(lst):
        lst.append(lst[-1] + 1)
        return lst

    lst = [jnp.zeros(())]
    with pytest.raises(ValueError, match=r"added init_val\[1\]"):
        tc.while_loop(lambda v: v[0] < 3, grow, lst, policy=policy)
    assert len(lst) == 1


def test_a_carry_type_change_names_the_key_path():
    state = {"n": jnp.zeros((), jnp.int32)}
    with pytest.raises(TypeError, match=r"init_val\['n'\] with type float32\[\]"):
        tc.fori_loop(0, 3, lambda i, c: {"n": c["n"] * 1.5}, state, policy="alias")
    with pytest.raises(TypeError, match=r"init\['v'\] with type float32\[3\]"):
        tc.scan(lambda c, x: ({"v": jnp.ones(3)}, None), {"v": jnp.ones(2)}, XS, policy="alias")


def test_mutated_in_place_but_replaced_in_the_carry_is_an_error_under_alias():
    def body(c, x):
        c["t"] = c["t"] + x
        return dict(c), None  # a copy: the caller's dict would keep iteration 1 only

    state = {"t": jnp.zeros(())}
    with pytest.raises(ValueError, match=r"(?s)init\['t'\]: replaced.*first iteration"):
        tc.scan(body, state, XS, policy="alias")
    assert float(state["t"]) == 0.0


def test_a_container_moved_to_another_place_or_a_shared_array_split_is_an_error():
    state = {"a": {"v": jnp.zeros(())}, "b": {"v": jnp.ones(())}}
    with pytest.raises(ValueError, match=r"container init\['b'\] at the place of init\['a'\]"):
        tc.scan(lambda c, x: ({"a": c["b"], "b": c["a"]}, None), state, XS, policy="alias")

    z = jnp.zeros(())
    state = {"m": z, "v": z}  # one array at two places
    with pytest.raises(ValueError, match=r"init\['m'\] and init\['v'\], which are one array"):
        tc.scan(lambda c, x: ({"m": c["m"] + x, "v": c["v"]}, None), state, XS, policy="alias")
    # giving two places one value is fine (they become one array, as in Python)
    state = {"m": jnp.zeros(()), "v": jnp.ones(())}
    out, _ = tc.scan(
        lambda c, x: (dict.fromkeys("mv", c["v"] + x), None), state, XS, policy="alias"
    )
    assert float(out["m"]) == float(out["v"]) == 11.0


def test_an_array_in_both_init_and_xs_is_carried_and_scanned_apart():
    # One array object as the carry and as xs: the loop carries it and scans its rows, as
    # jax.lax.scan does; a slice changed in place cannot be written back into that array.
    z = jnp.arange(3.0)
    out, ys = tc.scan(lambda c, x: (c + x, c.sum()), z, z, policy="alias")
    want, want_ys = jax.lax.scan(lambda c, x: (c + x, c.sum()), z, z)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(ys, want_ys)

    def body(c, x):
        x["a"] = x["a"] + 1
        return c, None

    xs = {"a": z}
    with pytest.raises(ValueError, match=r"(?s)xs\['a'\]: replaced.*shares an array with init"):
        tc.scan(body, z, xs, policy="alias")
    assert xs["a"] is z


def test_values_swapped_between_places_reach_only_the_returned_containers():
    # A functional swap: the caller's list keeps its arrays; an in-place swap writes the
    # caller's list with the final values, as the Python loop does.
    init = [jnp.array(0.0), jnp.array(1.0)]
    before = list(init)
    out = tc.fori_loop(0, 5, lambda i, c: [c[1], c[0] + c[1]], init, policy="alias")
    assert [float(v) for v in out] == [5.0, 8.0] and out is not init
    assert init[0] is before[0] and init[1] is before[1]

    def in_place(i, c):
        c["p"] = {"x": c["p"]["y"], "y": c["p"]["x"]}  # a new dict of the old one's arrays
        c["n"] = c["n"] + 1
        return c

    state = {"p": {"x": jnp.array(1.0), "y": jnp.array(2.0)}, "n": jnp.array(0)}
    inner = state["p"]
    assert tc.fori_loop(0, 3, in_place, state, policy="alias") is state
    assert (float(state["p"]["x"]), float(state["p"]["y"]), int(state["n"])) == (2.0, 1.0, 3)
    assert (float(inner["x"]), float(inner["y"])) == (1.0, 2.0)  # the replaced dict is left


def test_while_condition_changing_the_carry_is_an_error():
    def cond(s):
        s["peeked"] = s["peeked"] + 1
        return s["x"] < 3

    state = {"x": jnp.zeros(()), "peeked": jnp.zeros(())}
    body = lambda s: {"x": s["x"] + 1, "peeked": s["peeked"]}  # noqa: E731
    with pytest.raises(ValueError, match=r"(?s)condition, changed the carry.*init_val\['peeked'\]"):
        tc.while_loop(cond, body, state, policy="alias")
    with pytest.raises(tc.MutationError, match=r"init_val\['peeked'\]: replaced") as raised:
        tc.while_loop(cond, body, state, policy="strict")
    assert float(state["peeked"]) == 0.0
    assert "Change the carry in the body" in str(raised.value)  # not "use alias": it errs too


def test_bad_body_results_and_cycles_name_the_user_arguments():
    with pytest.raises(TypeError, match="must return a pair"):
        tc.scan(lambda c, x: c, {"t": jnp.zeros(())}, XS, policy="alias")
    cyclic: list = [jnp.zeros(())]
    cyclic.append(cyclic)
    for policy in ("clone", "alias", "strict"):
        with pytest.raises(ValueError, match="init"):
            tc.scan(lambda c, x: (c, None), cyclic, XS, policy=policy)
    with pytest.raises(TypeError, match=r"init\['f'\].*not a valid JAX type"):
        tc.scan(lambda c, x: (c, None), {"f": object()}, XS, policy="alias")


def test_closed_over_containers_are_outside_the_policy_and_leak_tracers():
    # docs/semantics.md, rule L9: the body's closure is not an input; what it appends is
    # the trace's value, as with jax.lax.scan itself.
    log = []

    def body(c, x):
        log.append(x)
        return c, None

    tc.scan(body, {"t": jnp.zeros(())}, XS, policy="alias")
    assert len(log) == 1 and isinstance(log[0], jax.core.Tracer)


def test_zero_iterations_leave_the_carry_as_it_was():
    def in_place(c, x):
        c["t"] = c["t"] + x
        return c, None

    state = {"t": jnp.ones(())}
    t = state["t"]
    out, _ = tc.scan(in_place, state, jnp.zeros((0,)), policy="alias")
    assert out is state and state["t"] is t
    # as the Python loop, also for a body that builds a new carry: init itself
    assert tc.fori_loop(3, 1, lambda i, c: {"t": c["t"] + i}, state, policy="alias") is state
    assert tc.scan(lambda c, x: (c, x), state, None, length=0, policy="strict")[0] is state
    # with a count known only when it runs (a traced bound, while_loop), the new carry is
    # built from the final leaves, which equal init's
    out = tc.jit(
        lambda s, n: tc.fori_loop(0, n, lambda i, c: {"t": c["t"] + i}, s, policy="alias"),
        policy="alias",
    )(state, 0)
    assert out is not state and float(out["t"]) == 1.0 and state["t"] is t


@pytest.mark.skipif(
    DebugInfo is None,
    reason="jax < 0.7 names a traced function's arguments itself",
)
def test_jax_messages_name_the_users_arguments_not_the_carried_leaves():
    def body(c, x):
        if c["t"] > x["a"]:  # a traced value as a bool
            pass
        return c, None

    for policy in ("clone", "alias", "strict"):
        with pytest.raises(jax.errors.TracerBoolConversionError, match=r"c\['t'\] and x\['a'\]"):
            tc.scan(body, {"t": jnp.zeros(())}, {"a": XS}, policy=policy)

    def fb(i, acc):
        return acc if acc[0] > 0 else acc

    with pytest.raises(jax.errors.TracerBoolConversionError, match=r"argument acc\[0\]"):
        tc.fori_loop(0, 3, fb, [jnp.zeros(())], policy="alias")


@jax.tree_util.register_pytree_node_class
class Box:
    def __init__(self, v):
        self.v = v

    def tree_flatten(self):
        return (self.v,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_an_attribute_the_pytree_does_not_carry_is_an_error_naming_it(policy):
    def body(c, x):
        c["box"].v = c["box"].v + x
        c["box"].note = x  # outside Box's flatten: it could not reach the caller's Box
        return c, None

    state = {"box": Box(jnp.zeros(()))}
    with pytest.raises(ValueError, match=r"attribute 'note' on init\['box'\]"):
        tc.scan(body, state, XS, policy=policy)
    assert float(state["box"].v) == 0.0 and not hasattr(state["box"], "note")
    # through the pytree, the caller's Box is updated in place
    out, _ = tc.scan(
        lambda c, x: (c, c["box"].__setattr__("v", c["box"].v + x)), state, XS, policy="alias"
    )
    assert out["box"] is state["box"] and float(state["box"].v) == 10.0


def test_eager_calls_reuse_the_trace_and_each_writes_its_own_callers_objects():
    traced = []

    def body(c, x):
        traced.append(1)
        c["t"] = c["t"] + x
        return c, None

    states = [{"t": jnp.full((), float(i))} for i in range(3)]
    for s in states:
        assert tc.scan(body, s, XS, policy="alias")[0] is s
    assert len(traced) == 1  # JAX's cached trace: the body ran once
    assert [float(s["t"]) for s in states] == [10.0, 11.0, 12.0]
    tc.scan(body, {"t": jnp.zeros(()), "u": jnp.ones(())}, XS, policy="alias")
    assert len(traced) == 2  # another structure: traced anew

    def functional(c, x):
        traced.append(1)
        return {"t": c["t"] + x}, None

    for _ in range(2):  # the same structure with another body: its own pattern
        s = {"t": jnp.zeros(())}
        assert tc.scan(functional, s, XS, policy="alias")[0] is not s
        assert float(s["t"]) == 0.0
    assert len(traced) == 3


def test_the_callers_arrays_are_not_kept_after_a_call():
    import gc
    import weakref

    leaf = np.ones(3, np.float32)
    ref = weakref.ref(leaf)

    def body(c, x):
        c["w"] = c["w"] + x
        return c, None

    state = {"w": leaf}
    tc.scan(body, state, XS, policy="alias")
    tc.fori_loop(0, 2, lambda i, c: body(c, i)[0], state, policy="alias")
    del leaf, state
    gc.collect()
    assert ref() is None


def test_a_raising_body_or_write_back_leaves_the_caller_as_it_was():
    def raising(c, x):
        c["t"] = c["t"] + x
        raise RuntimeError("boom")

    state = {"t": jnp.zeros(())}
    with pytest.raises(RuntimeError, match="boom"):
        tc.scan(raising, state, XS, policy="alias")
    assert float(state["t"]) == 0.0

    class Refuses:
        def __init__(self, v):
            self.v = v

    jax.tree_util.register_pytree_node(Refuses, lambda r: ((r.v,), None), lambda _, c: Refuses(*c))

    def refuse(target, source):
        raise RuntimeError("cannot write")

    tc.register_inplace(Refuses, refuse)

    def body(c, x):
        c["a"]["v"] = c["a"]["v"] + x  # written first (post-order), then undone
        c["b"].v = c["b"].v + x
        return c, None

    state = {"a": {"v": jnp.zeros(())}, "b": Refuses(jnp.zeros(()))}
    with pytest.raises(RuntimeError, match="cannot write"):
        tc.scan(body, state, XS, policy="alias")
    assert float(state["a"]["v"]) == 0.0 and float(state["b"].v) == 0.0


def test_gradient_with_respect_to_the_carry_through_an_in_place_loop():
    xs = jnp.arange(1.0, 4.0)

    def body(c, x):
        c["w"] = c["w"] * jnp.cos(x) + 0.1 * x
        return c, jnp.sum(c["w"] ** 2)

    def loss(params):
        return jnp.sum(tc.scan(body, params, xs, policy="alias")[1])

    def functional(w):
        step = lambda c, x: (lambda n: (n, jnp.sum(n**2)))(c * jnp.cos(x) + 0.1 * x)  # noqa: E731
        return jnp.sum(jax.lax.scan(step, w, xs)[1])

    w0 = jnp.array([0.5, -1.0])
    params = {"w": w0}
    grads = tc.grad(loss, policy="alias")(params)
    np.testing.assert_allclose(grads["w"], jax.grad(functional)(w0), rtol=1e-6)
    # the caller's params hold the loop's final state (concrete), as the Python loop leaves it
    final = jax.lax.scan(lambda c, x: (c * jnp.cos(x) + 0.1 * x, None), w0, xs)[0]
    np.testing.assert_allclose(params["w"], final, rtol=1e-6)
    assert not isinstance(params["w"], jax.core.Tracer)
    # under plain jax transformations too (the loop is then on the traced copies)
    np.testing.assert_allclose(
        jax.jit(jax.grad(lambda w: loss({"w": w})))(w0), jax.grad(functional)(w0), rtol=1e-6
    )


def test_threads_share_the_trace_and_each_writes_its_own_objects():
    import threading

    def body(c, x):
        c["t"] = c["t"] + x
        return c, None

    states = [[{"t": jnp.full((), float(10 * k + i))} for i in range(5)] for k in range(3)]
    errors = []

    def work(mine):
        try:
            for s in mine:
                assert tc.scan(body, s, XS, policy="alias")[0] is s
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(mine,)) for mine in states]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [[float(s["t"]) for s in mine] for mine in states] == [
        [10.0 * k + i + 10.0 for i in range(5)] for k in range(3)
    ]


# --- rule J30: the caller's carry changed through another name -----------------------------------

# The caller's carry, reached by a body through this global as well as through its argument.
LOOP_SHARED: dict = {}


def _run_loop(kind, step, carry, policy):
    """``kind``'s loop, three iterations of ``step(c)`` (which returns the new carry)."""
    if kind == "scan":
        return tc.scan(lambda c, x: (step(c), None), carry, jnp.arange(3.0), policy=policy)[0]
    if kind == "fori_loop":
        return tc.fori_loop(0, 3, lambda i, c: step(c), carry, policy=policy)
    return tc.while_loop(lambda c: c["n"] < 3, step, carry, policy=policy)


def _error_of(run):
    with pytest.raises(ValueError, match="through another name") as info:
        run()
    return str(info.value)


def _changed_path(message):
    return message.split(" changed ", 1)[1].split(" through another name", 1)[0]


@pytest.mark.parametrize("kind", ["scan", "fori_loop", "while_loop"])
@pytest.mark.parametrize("policy", ["alias", "strict"])
@pytest.mark.parametrize("where", ["eager", "jit"])
@pytest.mark.parametrize("through", ["global", "closure"])
def test_a_carry_also_changed_through_a_global_or_closure_is_rule_25s_error(
    kind, policy, where, through
):
    # docs/semantics.md, rule L16 (rule J30 for the loops): no write may vanish silently.
    LOOP_SHARED.clear()
    LOOP_SHARED.update(n=jnp.zeros(()), sub={"k": jnp.zeros(())})
    sub, n = LOOP_SHARED["sub"], LOOP_SHARED["n"]
    k = sub["k"]

    def program(closed):
        """The body: writes the caller's carry through the global or through ``closed``."""
        other = LOOP_SHARED if through == "global" else closed

        def step(c):
            other["sub"]["k"] = c["n"] + 1.0  # the caller's carry, through another name
            c["n"] = c["n"] + 1.0
            return c

        return step

    if where == "eager":
        message = _error_of(lambda: _run_loop(kind, program(LOOP_SHARED), LOOP_SHARED, policy))
        expected = "init['sub']" if kind == "scan" else "init_val['sub']"
    else:

        def outer(d):
            return _run_loop(kind, program(d), d, policy)

        message = _error_of(lambda: tc.jit(outer, policy=policy)(LOOP_SHARED))
        # Through the global, the write reaches jit's caller (jit's watch names its argument);
        # through a closure on jit's argument, it reaches the loop's caller (the loop's).
        if through == "global":
            expected = "d['sub']"
        else:
            expected = "init['sub']" if kind == "scan" else "init_val['sub']"
    assert _changed_path(message) == expected
    # jit's own rule J30 on the same write: the same error kind and text after the path.
    jit_message = _error_of(
        lambda: tc.jit(lambda d: program(LOOP_SHARED)(d), policy=policy)(LOOP_SHARED)
    )
    assert _changed_path(jit_message) == "d['sub']"
    assert (
        message.split(" through another name", 1)[1]
        == jit_message.split(" through another name", 1)[1]
    )
    # The caller's objects are as they were: the same containers holding the same arrays.
    assert list(LOOP_SHARED) == ["n", "sub"] and LOOP_SHARED["sub"] is sub
    assert LOOP_SHARED["n"] is n and list(sub) == ["k"] and sub["k"] is k


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_a_while_condition_changing_the_carry_through_a_global_is_rule_25s_error(policy):
    # docs/semantics.md, rule L16: the condition is watched as the body is.
    LOOP_SHARED.clear()
    LOOP_SHARED.update(n=jnp.zeros(()))
    n = LOOP_SHARED["n"]

    def cond(c):
        LOOP_SHARED["seen"] = c["n"]
        return c["n"] < 3

    def body(c):
        c["n"] = c["n"] + 1.0
        return c

    message = _error_of(lambda: tc.while_loop(cond, body, LOOP_SHARED, policy=policy))
    assert message.startswith("test_a_while_condition") and _changed_path(message) == "init_val"
    assert list(LOOP_SHARED) == ["n"] and LOOP_SHARED["n"] is n
