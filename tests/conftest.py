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

import profiles  # noqa: E402
import pytest  # noqa: E402
import trees  # noqa: E402  (registers jax-only node types before treeclone is imported)

# The hypothesis profile: "ci", or "long" with TREECLONE_LONG=1 (tests/support/profiles.py).
profiles.load()


@pytest.fixture(params=trees.CORPUS_IDS)
def corpus_id(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def tree(corpus_id: str):
    """A freshly built corpus tree."""
    return trees.CORPUS_BY_ID[corpus_id]()
