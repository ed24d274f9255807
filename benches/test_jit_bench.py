"""Micro benchmarks of the call path: ``jax.jit`` against ``treeclone.jit`` under each policy.

    pytest benches/test_jit_bench.py --benchmark-only

The calls of ``jit_cases.py``, each in its own group so pytest-benchmark prints the contenders
side by side: an MLP train step with Adam (dispatch-bound), the identity function over a
~600-leaf transformer+Adam tree (pure call overhead: flatten, dispatch, rebuild), a step that
trains half of the parameters and returns the other half unchanged, a near-empty call on a
49-leaf tree, and a trivial function with a static argument. The training-loop figures
in docs/benchmarks.md come from ``python -m treeclone.bench`` (interleaved, median of rounds).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from benches.jit_cases import CASES, CONTENDERS, build_case, jitted


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("case", list(CASES))
def test_jit_call(benchmark, case, contender):
    args = build_case(case)[1]
    call = jitted(contender, case)
    jax.block_until_ready(call(*args))  # compile outside the timing
    benchmark.group = f"jit-{case}"
    benchmark.extra_info.update(case=case, contender=contender)
    out = benchmark(lambda: jax.block_until_ready(call(*args)))
    expected = jitted("jax.jit", case)(*args)
    assert jax.tree.structure(out) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
        assert jnp.allclose(a, b)
