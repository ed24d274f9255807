"""Rule 14 of docs/semantics.md: a cycle in a call's arguments is a ValueError naming the
argument and the key path, with the same text under every policy, and the process stays
usable. Under clone this is treeclone's own check: jax.jit's flatten, met with a cycle through
a dict, exhausts the interpreter's recursion counter for good (every later Python call raises
RecursionError), so the cases run in a child process that reports what it saw."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent(
    """
    import collections, json, sys
    import jax, jax.numpy as jnp, numpy as np
    import treeclone as tc

    @jax.tree_util.register_pytree_node_class
    class Box:
        def __init__(self, items):
            self.items = items
        def tree_flatten(self):
            return (self.items,), None
        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

    def cyclic(kind, leaf):
        if kind == "dict":
            d = {"w": leaf, "inner": {}}
            d["inner"]["up"] = d
            return d
        if kind == "list":
            l = [leaf]
            l.append(l)
            return l
        if kind == "ordereddict":
            d = collections.OrderedDict(w=leaf)
            d["self"] = d
            return d
        if kind == "registered":
            b = Box([leaf])
            b.items.append(b)
            return b
        raise ValueError(kind)

    def headroom():
        def down(n):
            return 0 if n == 0 else 1 + down(n - 1)
        return down(500)

    report = {}
    for kind in ("dict", "list", "ordereddict", "registered"):
        for policy in ("clone", "alias", "strict"):
            for how in ("positional", "keyword"):
                f = tc.jit(lambda scale, cfg: scale, policy=policy)
                leaf = np.ones(2) if policy == "call" else jnp.ones(2)
                arg = cyclic(kind, leaf)
                try:
                    f(1.0, arg) if how == "positional" else f(1.0, cfg=arg)
                    outcome = "no error"
                except ValueError as e:
                    outcome = str(e)
                except BaseException as e:
                    outcome = f"{type(e).__name__}: {e}"[:200]
                report[f"jit {kind} {policy} {how}"] = [outcome, headroom()]
            try:
                tc.call(lambda scale, cfg: scale, 1.0, cyclic(kind, np.ones(2)), policy=policy)
                outcome = "no error"
            except ValueError as e:
                outcome = str(e)
            report[f"call {kind} {policy} positional"] = [outcome, headroom()]
    sys.stdout.write(json.dumps(report))
    """
)

_EXPECTED = {
    "dict": "cycle detected in pytree: the dict at cfg contains itself at relative key path "
    "['inner']['up']",
    "list": "cycle detected in pytree: the list at cfg contains itself at relative key path [1]",
    "ordereddict": "cycle detected in pytree: the OrderedDict at cfg contains itself at "
    "relative key path ['self']",
    "registered": "cycle detected in pytree: the Box at cfg contains itself at relative key "
    "path [<flat index 0>][1]",
}


@pytest.fixture(scope="module")
def report() -> dict[str, list]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("how", ["positional", "keyword"])
@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
@pytest.mark.parametrize("kind", sorted(_EXPECTED))
def test_cycle_in_arguments_is_a_value_error(report, kind, policy, how):
    outcome, headroom = report[f"jit {kind} {policy} {how}"]
    assert outcome == _EXPECTED[kind]
    assert headroom == 500  # the interpreter can still recurse: nothing leaked


@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
@pytest.mark.parametrize("kind", sorted(_EXPECTED))
def test_cycle_in_arguments_of_call_is_the_same_value_error(report, kind, policy):
    outcome, headroom = report[f"call {kind} {policy} positional"]
    assert outcome == _EXPECTED[kind]
    assert headroom == 500
