"""The hypothesis profiles of the suite, and the example budget of property tests.

``ci`` (the default), ``long`` (``TREECLONE_LONG=1``) and ``brief`` (a quarter of ``ci``: what
``.ci/run`` gives the runs on the other interpreters and JAX releases, where what differs is
met by every example; the main suite runs ``ci``), or ``TREECLONE_HYPOTHESIS_PROFILE`` naming
any registered profile. ``tests/conftest.py`` loads the profile; a script that a test
runs in a subprocess (``tests/transforms/test_shard_map.py``) calls :func:`load` itself, so
that its property test has the same budget.

A property test runs the profile's ``max_examples``, or, where each example costs a trace and a
compilation (the transforms' property tests), :func:`max_examples` of it: a fixed count in
``ci`` that scales with the profile, so ``TREECLONE_LONG=1`` deepens every property test by the
long profile's factor. Never a hard-coded ``max_examples``: it would override the profile.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI_MAX_EXAMPLES = 200
LONG_MAX_EXAMPLES = 5000
BRIEF_MAX_EXAMPLES = 50

settings.register_profile(
    "ci",
    max_examples=CI_MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "brief",
    max_examples=BRIEF_MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=LONG_MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def load() -> str:
    """Load the profile the environment selects (``TREECLONE_HYPOTHESIS_PROFILE``, else
    ``long`` under ``TREECLONE_LONG=1``, else ``ci``); returns its name."""
    long = os.environ.get("TREECLONE_LONG", "") not in ("", "0")
    name = os.environ.get("TREECLONE_HYPOTHESIS_PROFILE", "long" if long else "ci")
    settings.load_profile(name)
    return name


def max_examples(in_ci: int) -> int:
    """The example count of a property test that runs ``in_ci`` examples under ``ci``: scaled
    by the loaded profile's ``max_examples`` (25 times as many under ``long``, a quarter under
    ``brief``), at least 1."""
    return max(1, in_ci * settings().max_examples // CI_MAX_EXAMPLES)
