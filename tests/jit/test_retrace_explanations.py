"""Retracing under ``alias`` and ``strict`` is explained in the user's words: with JAX's
``jax_explain_cache_misses`` on, each trace again logs, where JAX logs its own explanations,
what differs by argument and key path; a function that traces again at every call because its
own write-back changes its structure gets one ``RetraceWarning`` (docs/semantics.md,
"Retracing")."""

from __future__ import annotations

import doctest
import logging
import os
import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import pytest
import treeclone as tc
from treeclone import _retrace

# The logger JAX logs its tracing-cache misses on (jax._src.interpreters.partial_eval).
JAX_LOGGER = "jax._src.interpreters.partial_eval"
HERE = os.path.basename(__file__)
# treeclone's own files (its package's folder): an explanation names the user's, never these.
TREECLONE_FILES = os.path.dirname(tc.__file__) + os.sep


@pytest.fixture
def explained(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """JAX's explanations on (restored afterwards), captured from JAX's logger."""
    before = jax.config.jax_explain_cache_misses
    jax.config.update("jax_explain_cache_misses", True)
    try:
        with caplog.at_level(logging.WARNING, logger=JAX_LOGGER):
            yield caplog
    finally:
        jax.config.update("jax_explain_cache_misses", before)


def treeclone_explanations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "treeclone.jit traced" in r.getMessage()]


def append_step(state, x):
    state["hist"].append(x)
    state["w"] = state["w"] + x
    return state["w"].sum()


def history(n: int) -> dict:
    return {"w": jnp.zeros(2), "hist": [jnp.full(2, float(i)) for i in range(n)]}


def test_a_step_appending_to_its_state_warns_once_naming_the_key_path() -> None:
    def step(state, x):  # a new function: its own cache
        return append_step(state, x)

    f = tc.jit(step, policy="alias")
    state = history(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(30):
            f(state, jnp.ones(2))
    retraces = [w for w in caught if issubclass(w.category, tc.RetraceWarning)]
    assert len(retraces) == 1
    message = str(retraces[0].message)
    assert "state['hist']: list grew from 7 to 8" in message
    assert "last 6 calls" in message and "step (" in message and "preallocate" in message
    assert os.path.basename(retraces[0].filename) == HERE  # the user's call, not treeclone's
    assert len(state["hist"]) == 33 and f._cache_size() == 30


def test_five_calls_are_not_yet_a_warning() -> None:
    def step(state, x):
        return append_step(state, x)

    f = tc.jit(step, policy="alias")
    state = history(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.RetraceWarning)
        for _ in range(RETRACES := _retrace.RETRACE_STREAK):
            f(state, jnp.ones(2))
        with pytest.warns(tc.RetraceWarning):
            f(state, jnp.ones(2))
    assert RETRACES == 5


def test_the_second_trace_is_explained_by_key_path_in_the_users_file(
    explained: pytest.LogCaptureFixture,
) -> None:
    def step(state, x):
        return append_step(state, x)

    f = tc.jit(step, policy="alias")
    state = history(3)
    f(state, jnp.ones(2))
    assert treeclone_explanations(explained) == []  # a first trace: JAX's "never seen" says it
    f(state, jnp.ones(2))
    (explanation,) = treeclone_explanations(explained)
    assert "state['hist']: list grew from 3 to 4" in explanation
    assert HERE in explanation and "policy alias" in explanation
    everything = "\n".join(r.getMessage() for r in explained.records)
    assert "ArgsBox" not in everything and TREECLONE_FILES not in everything
    assert f"TRACING CACHE MISS at {__file__}" in everything  # JAX's callsite: the user's line
    assert "re-defined" not in everything
    assert all(r.levelno == logging.WARNING for r in explained.records)


def test_under_clone_jaxs_explanation_names_the_users_function_and_call(
    explained: pytest.LogCaptureFixture,
) -> None:
    def scale(x):
        return x * 2

    f = tc.jit(scale)  # clone: jax.jit's own call and explanation
    f(jnp.ones(2))
    f(jnp.ones(3))
    everything = "\n".join(r.getMessage() for r in explained.records)
    assert f"TRACING CACHE MISS at {__file__}" in everything
    assert f"for scale defined at {__file__}" in everything
    assert TREECLONE_FILES not in everything
    assert treeclone_explanations(explained) == []  # jax.jit's trace: JAX explains it


def test_a_shape_change_is_explained_by_key_path(explained: pytest.LogCaptureFixture) -> None:
    f = tc.jit(lambda batch: batch["x"].sum(), policy="alias")
    f({"x": jnp.ones((8, 2))})
    f({"x": jnp.ones((16, 2))})
    (explanation,) = treeclone_explanations(explained)
    assert "batch['x']: shape changed from f32[8,2] to f32[16,2]" in explanation


def test_a_static_argument_change_is_explained(explained: pytest.LogCaptureFixture) -> None:
    f = tc.jit(lambda x, n: x * n, policy="alias", static_argnames="n")
    f(jnp.ones(2), n=2)
    f(jnp.ones(2), n=3)
    (explanation,) = treeclone_explanations(explained)
    assert "n: static value changed from 2 to 3" in explanation


def test_strict_explains_a_key_added(explained: pytest.LogCaptureFixture) -> None:
    f = tc.jit(lambda batch: batch["x"].sum(), policy="strict")
    f({"x": jnp.ones(2)})
    f({"x": jnp.ones(2), "y": jnp.ones(2)})
    (explanation,) = treeclone_explanations(explained)
    assert "batch: key added: 'y'" in explanation and "policy strict" in explanation


def test_jit_partial_explains_and_warns_by_the_bound_arguments_name(
    explained: pytest.LogCaptureFixture,
) -> None:
    def step(state, x):
        return append_step(state, x)

    state = history(3)
    p = tc.jit_partial(step, state, policy="alias")
    with pytest.warns(tc.RetraceWarning, match=r"state\['hist'\]"):
        for _ in range(8):
            p(jnp.ones(2))
    explanations = treeclone_explanations(explained)
    assert "state['hist']: list grew from 3 to 4" in explanations[0]
    assert len(state["hist"]) == 11


def test_the_caller_changing_the_inputs_is_explained_but_not_warned(
    explained: pytest.LogCaptureFixture,
) -> None:
    def total(state):
        return sum(x.sum() for x in state["hist"])

    f = tc.jit(total, policy="alias")
    state = history(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.RetraceWarning)
        for i in range(12):
            f(state)
            state["hist"].append(jnp.full(2, float(i)))  # the caller's change, not the step's
    assert f._cache_size() == 12
    assert "state['hist']: list grew from 11 to 12" in treeclone_explanations(explained)[-1]


def test_a_stable_step_is_neither_explained_nor_warned(
    explained: pytest.LogCaptureFixture,
) -> None:
    def step(state, x):
        state["w"] = state["w"] + x
        state["n"] = state["n"] + 1

    f = tc.jit(step, policy="alias")
    state = {"w": jnp.zeros(2), "n": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error", tc.RetraceWarning)
        for _ in range(12):
            f(state, jnp.ones(2))
    assert treeclone_explanations(explained) == [] and f._cache_size() <= 2


def test_retrace_examples_pass() -> None:
    result = doctest.testmod(_retrace, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 3
