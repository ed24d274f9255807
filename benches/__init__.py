"""treeclone's benchmarks (a package so that pytest imports them as ``benches.*``, apart from
``tests/``, which has modules of the same names)."""
