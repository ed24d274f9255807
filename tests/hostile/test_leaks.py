"""Leaks: hundreds of thousands of flatten/unflatten calls keep memory and refcounts flat.

The workload is ``leak_workload.py`` (see its docstring); it runs in a subprocess. The number of
calls is ``TREECLONE_LEAK_CALLS`` (default 300,000; 10,000,000 with ``TREECLONE_LONG=1``).
"""

from __future__ import annotations

import ast
import os

from helpers import LONG, run_script

CALLS = int(os.environ.get("TREECLONE_LEAK_CALLS", 10_000_000 if LONG else 300_000))


def test_memory_and_refcounts_stay_flat():
    out = run_script(
        f"""
import leak_workload
print("REPORT", leak_workload.run({CALLS}, rss_slack_mib=8.0))
""",
        timeout=60 + CALLS / 10_000,
    )
    report = ast.literal_eval(next(x for x in out.splitlines() if x.startswith("REPORT "))[7:])
    print(report)
    assert report["calls"] >= CALLS - 16  # whole rounds of 16 calls


def test_the_leak_check_catches_a_leak():
    """The same check fails when each round keeps one more reference to a sample leaf, or
    about 1 KiB of memory."""
    run_script(
        """
import leak_workload

kept = []
real_round = leak_workload.one_round

def leaky_refs(rng):
    real_round(rng)
    kept.append(leak_workload.LEAF)

def leaky_memory(rng):
    real_round(rng)
    kept.append(bytearray(1024))

for leaky, what in ((leaky_refs, "refcounts changed"), (leaky_memory, "RSS grew")):
    leak_workload.one_round = leaky
    try:
        leak_workload.run(200_000)
    except AssertionError as exc:
        assert what in str(exc), exc
    else:
        raise AssertionError(f"the leak check missed a leak ({what})")
    kept.clear()
"""
    )


# 9,000 calls in CI (30,000 took 89-114 s of CI's time): the refcount check is exact at any
# count; RSS growth under 8 MiB over 3,000 rounds still catches a leak of 3 KB a round.
JIT_CALLS = 300_000 if LONG else 9_000


def test_jitted_calls_keep_memory_and_refcounts_flat():
    """Jitted calls under every policy (alias writes back into the same objects each time;
    strict fails its check every time, which the script checks): flat memory, leaf refcounts
    back where they were."""
    out = run_script(
        f"""
import gc, sys
import jax.numpy as jnp
import treeclone
from leak_workload import rss_bytes

def step(state, x):
    state["w"] = state["w"] * 0.5 + x
    return state["w"].sum(), state["frozen"]

calls = {{p: treeclone.jit(step, policy=p) for p in ("clone", "alias", "strict")}}
x = jnp.ones(4)
state = {{"w": jnp.zeros(4), "frozen": jnp.arange(4.0)}}
frozen = state["frozen"]

def one_round():
    calls["clone"](state, x)
    calls["alias"](state, x)
    try:
        calls["strict"](state, x)
    except treeclone.MutationError as exc:
        assert "state['w']: replaced" in str(exc), exc
    else:
        raise AssertionError("strict: no MutationError for the unreturned state['w']")

for _ in range(300):
    one_round()
gc.collect()
refs = (sys.getrefcount(frozen), sys.getrefcount(x), sys.getrefcount(state))
rss = rss_bytes()
rounds = {JIT_CALLS} // 3
for _ in range(rounds):
    one_round()
gc.collect()
growth = (rss_bytes() - rss) / 2**20
after = (sys.getrefcount(frozen), sys.getrefcount(x), sys.getrefcount(state))
assert after == refs, (refs, after)
assert growth < 8.0, growth
assert state["frozen"] is frozen
print("REPORT", {{"calls": 3 * rounds, "rss_growth_mib": round(growth, 3)}})
""",
        timeout=120 + JIT_CALLS / 100,  # a hang guard: 30,000 calls took 114 s in CI
    )
    print(next(x for x in out.splitlines() if x.startswith("REPORT ")))
