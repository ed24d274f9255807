"""pytest configuration for the micro benchmarks in this folder.

pytest-benchmark times every benchmark in full unless told otherwise, which takes minutes
here. So, unless ``--benchmark-only`` or ``--benchmark-enable`` is given, the benchmarks run
in ``--benchmark-disable`` mode: each benchmarked call runs once, as a plain smoke test.

    pytest benches/                    # quick: every call once, plus the agreement checks
    pytest benches/ --benchmark-only   # timed, grouped side by side per operation and tree
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    opt = config.option
    if not getattr(opt, "benchmark_only", True) and not getattr(opt, "benchmark_enable", True):
        opt.benchmark_disable = True
