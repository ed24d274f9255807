"""Micro benchmarks of the call path: ``jax.jit`` against ``treeclone.jit`` under each policy.

    pytest benches/test_jit_bench.py --benchmark-only

Three calls, each in its own group so pytest-benchmark prints the contenders side by side:
an MLP train step with Adam (dispatch-bound), the identity function over a ~600-leaf
transformer+Adam tree (pure call overhead: flatten, dispatch, rebuild), and a step that
trains half of the parameters and returns the other half unchanged. The training-loop figures
in docs/benchmarks.md come from ``python -m treeclone.bench`` (interleaved, median of rounds).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from benches.jit_cases import CASES, CONTENDERS, build_case, wrap


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("case", list(CASES))
def test_jit_call(benchmark, case, contender):
    fun, args = build_case(case)
    jitted = wrap(contender, fun)
    jax.block_until_ready(jitted(*args))  # compile outside the timing
    benchmark.group = f"jit-{case}"
    benchmark.extra_info.update(case=case, contender=contender)
    out = benchmark(lambda: jax.block_until_ready(jitted(*args)))
    expected = jax.jit(fun)(*args)
    assert jax.tree.structure(out) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
        assert jnp.allclose(a, b)
