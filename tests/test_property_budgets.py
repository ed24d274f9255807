"""Property tests take their example budget from the hypothesis profile
(``tests/support/profiles.py``): ``TREECLONE_LONG=1`` deepens every one of them."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from helpers import SUPPORT_DIR, child_env

TESTS = pathlib.Path(__file__).parent
# The fuzzer's hypothesis driver runs batches until its time is up (--seconds, longer under
# TREECLONE_LONG=1): its max_examples is a batch size, not a budget.
NOT_PROPERTY_TESTS = {"support/fuzz_tree.py"}


def test_no_property_test_hard_codes_its_example_count():
    hard_coded = [
        f"{path.relative_to(TESTS)}:{text.count(chr(10), 0, m.start()) + 1}"
        for path in sorted(TESTS.rglob("*.py"))
        if str(path.relative_to(TESTS)) not in NOT_PROPERTY_TESTS
        for text in [path.read_text()]
        for m in re.finditer(r"max_examples\s*=\s*\d", text)
    ]
    assert not hard_coded, (
        f"max_examples overriding the profile (use profiles.max_examples): {hard_coded}"
    )


def test_the_budget_scales_with_the_profile():
    script = (
        "import profiles\n"
        "print(profiles.load(), profiles.max_examples(6), profiles.max_examples(25))\n"
    )
    for env, want in (
        ({}, "ci 6 25"),
        ({"TREECLONE_LONG": "1"}, "long 150 625"),
        ({"TREECLONE_HYPOTHESIS_PROFILE": "brief"}, "brief 1 6"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=SUPPORT_DIR,
            env=child_env(drop=("TREECLONE_",), **env),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.split() == want.split(), out
