"""The lifted transformations nested in each other under ``alias`` (issue 13: "composable with
each other and with ``treeclone.jit`` in any nesting"): each nesting against the plain Python
program it stands for, on the caller's objects. The nestings of one transformation with jit
and grad are in each transformation's own tests; these cross the modules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import treeclone as tc


def test_vmap_of_scan_runs_each_examples_loop_on_its_own_row():
    def per_example(state, xs):
        def body(c, x):
            c["total"] = c["total"] + x
            c["n"] = c["n"] + 1
            return c, c["total"]

        _, ys = tc.scan(body, state, xs, policy="alias")
        return ys

    state = {"total": jnp.zeros(4), "n": jnp.zeros(4)}
    xs = jnp.arange(12.0).reshape(4, 3)
    ys = tc.vmap(per_example, policy="alias")(state, xs)

    # Plain Python: for each example, its own loop over its own row.
    totals, counts, rows = [], [], []
    for i in range(4):
        total, n, row = 0.0, 0, []
        for x in np.asarray(xs[i]):
            total, n = total + x, n + 1
            row.append(total)
        totals.append(total)
        counts.append(n)
        rows.append(row)
    np.testing.assert_allclose(state["total"], totals)
    np.testing.assert_allclose(state["n"], counts)
    np.testing.assert_allclose(ys, rows)


def test_scan_whose_body_branches_with_cond_updates_the_carry():
    def body(c, x):
        def positive(c):
            c["pos"] = c["pos"] + x

        def negative(c):
            c["neg"] = c["neg"] - x

        tc.cond(x > 0, positive, negative, c, policy="alias")
        return c, None

    state = {"pos": jnp.zeros(()), "neg": jnp.zeros(())}
    out, _ = tc.scan(body, state, jnp.array([1.0, -2.0, 3.0, -0.5]), policy="alias")
    assert out is state
    np.testing.assert_allclose([state["pos"], state["neg"]], [4.0, 2.5])


def test_grad_through_a_scan_of_a_checkpointed_body_equals_jax():
    xs = jnp.array([0.3, -0.1, 0.7])

    def loss(params, xs):
        def body(c, x):
            c["h"] = jnp.tanh(c["h"] * params["w"] + x)
            return c, None

        carry = {"h": jnp.ones(())}
        tc.scan(tc.checkpoint(body, policy="alias"), carry, xs, policy="alias")
        return carry["h"]

    def reference(params, xs):
        def body(h, x):
            return jnp.tanh(h * params["w"] + x), None

        return jax.lax.scan(jax.checkpoint(body), jnp.ones(()), xs)[0]

    params = {"w": jnp.asarray(0.5)}
    got = tc.grad(loss, policy="alias")(params, xs)
    want = jax.grad(reference)(params, xs)
    np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)


def test_jit_of_vmap_of_cond_writes_only_the_taken_rows():
    traces = []

    @tc.jit(policy="alias")
    def step(state, xs):
        traces.append(None)

        def per_example(s, x):
            def bump(s):
                s["v"] = s["v"] + x

            tc.cond(x > 0, bump, lambda s: None, s, policy="alias")

        tc.vmap(per_example, policy="alias")(state, xs)

    state = {"v": jnp.zeros(3)}
    for xs in (jnp.array([1.0, -1.0, 2.0]), jnp.array([-3.0, 4.0, 0.5])):
        step(state, xs)
    np.testing.assert_allclose(state["v"], [1.0, 4.0, 2.5])
    assert len(traces) == 1
