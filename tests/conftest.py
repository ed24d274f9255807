"""Shared pytest configuration for the treeclone test suite.

The tests are grouped by subject in subfolders; ``support/`` holds what they share and the
scripts they run in subprocesses (not tests), and is put on ``sys.path`` here.

``trees`` is imported first, before anything imports ``treeclone``: it registers several node
types with ``jax.tree_util`` *before* treeclone exists in the process, which is part of what
is being tested.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

import pytest  # noqa: E402
import trees  # noqa: E402  (registers jax-only node types before treeclone is imported)
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# TREECLONE_LONG=1 (see helpers.LONG) also selects the long profile unless one is named.
_DEFAULT_PROFILE = "long" if os.environ.get("TREECLONE_LONG", "") not in ("", "0") else "ci"
settings.load_profile(os.environ.get("TREECLONE_HYPOTHESIS_PROFILE", _DEFAULT_PROFILE))


@pytest.fixture(params=trees.CORPUS_IDS)
def corpus_id(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def tree(corpus_id: str):
    """A freshly built corpus tree."""
    return trees.CORPUS_BY_ID[corpus_id]()
