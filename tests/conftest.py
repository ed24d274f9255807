"""Shared pytest configuration for the treeclone test suite.

``trees`` is imported first, before anything imports ``treeclone``: it registers several node
types with ``jax.tree_util`` *before* treeclone exists in the process, which is part of what
is being tested.
"""

import os

import pytest
import trees  # registers jax-only node types before treeclone is imported
from hypothesis import HealthCheck, settings

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
settings.load_profile(os.environ.get("TREECLONE_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=trees.CORPUS_IDS)
def corpus_id(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def tree(corpus_id: str):
    """A freshly built corpus tree."""
    return trees.CORPUS_BY_ID[corpus_id]()
