"""CPython's internals behind one gate (rust/cpython/, docs/semantics.md "CPython internals"):
read on the interpreters treeclone has verified unless ``TREECLONE_NO_CPYTHON_INTERNALS`` is
set; without them ``jit_partial`` flattens its bound arguments at every call, with the same
results. The reads themselves are checked by the Rust tests (``cargo test``); the whole of
``tests/jit/test_jit_partial.py`` and ``tests/policies`` also runs with the switch set in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import treeclone as tc
from helpers import child_env

VERIFIED = (3, 11) <= sys.version_info[:2] <= (3, 13) and not sysconfig.get_config_var(
    "Py_GIL_DISABLED"
)


def test_the_internals_are_read_where_verified_unless_switched_off():
    switch = os.environ.get("TREECLONE_NO_CPYTHON_INTERNALS", "")
    state, why = tc._native.cpython_internals()
    if not VERIFIED:
        assert state == "unverified" and f"{sys.version_info[0]}.{sys.version_info[1]}" in why
    elif switch not in ("", "0"):
        assert (state, why) == ("switched off", None)
    else:
        assert (state, why) == ("on", None)


SWITCHED_OFF = """
import warnings
import jax, jax.numpy as jnp, numpy as np  # JAX may warn at its import (a TPU v5e VM does)
warnings.simplefilter("error")  # switched off on purpose: treeclone says nothing at import
import treeclone as tc
warnings.resetwarnings()
assert tc._native.cpython_internals() == ("switched off", None)

FLATTENS = 0


class Layer:
    __slots__ = ("w", "scale")

    def __init__(self, w, scale):
        self.w, self.scale = w, scale


def flatten(layer):
    global FLATTENS
    FLATTENS += 1
    return (layer.w,), layer.scale


jax.tree_util.register_pytree_node(Layer, flatten, lambda scale, c: Layer(c[0], scale))


def step(layer, state, x):
    layer.w = layer.w * layer.scale + x  # a slot, written back through object.__setattr__
    state["n"] = state["n"] + 1
    return layer.w.sum()


layer, state = Layer(jnp.ones(2), 2.0), {"n": jnp.zeros(())}
plain_layer, plain_state = Layer(np.ones(2), 2.0), {"n": np.zeros(())}
p = tc.jit_partial(step, layer, state)
per_call = []
for i in range(5):
    if i == 3:  # changed between calls: used, as always
        layer.scale = plain_layer.scale = 3.0
    before = FLATTENS
    got, want = p(float(i)), step(plain_layer, plain_state, float(i))
    per_call.append(FLATTENS - before)
    assert float(got) == float(want), (i, got, want)
    assert np.asarray(layer.w).tolist() == plain_layer.w.tolist()
    assert float(state["n"]) == float(plain_state["n"]) == i + 1
assert not p._bound.snapshot.checkable
# Every call flattens the bound arguments (once where nothing traces again).
assert all(n >= 1 for n in per_call) and per_call[1] == per_call[2] == per_call[4] == 1, per_call
print("SCRIPT-OK")
"""


# A variable that makes JAX itself warn at its import, as it does on a TPU v5e VM without
# transparent hugepages (jax/_src/cloud_tpu_init.py): the child must not take that for
# treeclone's, nor open the accelerator the parent holds (``child_env``).
JAX_WARNS_AT_IMPORT = {"TPU_LIBRARY_PATH": "/nonexistent/libtpu.so"}


@pytest.mark.parametrize("extra", [{}, JAX_WARNS_AT_IMPORT], ids=["quiet", "jax-warns"])
def test_switched_off_jit_partial_flattens_at_every_call_with_the_same_results(extra):
    env = child_env(TREECLONE_NO_CPYTHON_INTERNALS="1", **extra)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SWITCHED_OFF)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    detail = f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0 and "SCRIPT-OK" in proc.stdout, detail
