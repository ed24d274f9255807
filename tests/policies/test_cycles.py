"""Rule J17 of docs/semantics.md: a cycle in a call's arguments is a ValueError naming the
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
from helpers import child_env

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

    # Static arguments: jax.jit and jax.checkpoint hash them and never flatten them, so only the
    # others are checked (a static one that is cyclic, or whose flatten raises, is never
    # looked at); a cycle in a dynamic one is still the ValueError naming it.
    @jax.tree_util.register_pytree_node_class
    class Refuses:  # hashable (by identity): a valid static argument, not a valid pytree
        def tree_flatten(self):
            raise TypeError("a static argument was flattened")
        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls()

    def varargs(*args):
        return args[0]["w"] * 2

    def first_static(opt, cfg):
        return cfg["w"] * 2

    def body(cfg, opt):
        return cfg["w"] * 2

    # name: (transformation, function, options, how the call passes (cfg, opt))
    static_cases = {
        "jit argnums": (tc.jit, body, {"static_argnums": 1}, "positional"),
        "jit argnums by keyword": (tc.jit, body, {"static_argnums": 1}, "keyword"),
        "jit argnums first": (tc.jit, first_static, {"static_argnums": 0}, "static first"),
        "jit negative argnums": (tc.jit, varargs, {"static_argnums": -1}, "positional"),
        "jit argnames": (tc.jit, body, {"static_argnames": "opt"}, "keyword"),
        "jit argnames positional": (tc.jit, body, {"static_argnames": "opt"}, "positional"),
        "checkpoint argnums": (tc.checkpoint, body, {"static_argnums": 1}, "positional"),
        "checkpoint negative argnums": (tc.checkpoint, body, {"static_argnums": -1}, "positional"),
    }

    def static_values():
        box = Box([jnp.ones(2)])
        box.items.append(box)  # cyclic, hashable
        loop = []
        loop.append(loop)  # cyclic, not hashable
        return {"plain": "fast", "cyclic": box, "refuses": Refuses(), "unhashable cyclic": loop}

    old_jax = tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 7)
    for name, (transform, fun, options, how) in static_cases.items():
        for policy in ("clone", "alias", "strict"):
            for value_kind, opt in static_values().items():
                for cfg_kind in ("cyclic", "plain"):
                    if old_jax and policy == "clone" and cfg_kind == "plain" and value_kind in (
                        "cyclic", "refuses"
                    ):
                        # jax.jit before 0.7 flattens its static arguments itself: a cyclic
                        # one exhausts the recursion counter for good. clone is jax.jit.
                        report[f"{name} {policy} {value_kind} {cfg_kind}"] = [
                            "skip: jax.jit before JAX 0.7 flattens its static arguments", 500
                        ]
                        continue
                    f = transform(fun, policy=policy, **options)
                    cfg = {"w": jnp.ones(2)}
                    if cfg_kind == "cyclic":
                        cfg = cyclic("dict", jnp.ones(2))
                    try:
                        if how == "positional":
                            out = f(cfg, opt)
                        elif how == "keyword":
                            out = f(cfg, opt=opt)
                        else:
                            out = f(opt, cfg=cfg)
                        outcome = f"ok {np.asarray(out).tolist()}"
                    except ValueError as e:
                        outcome = str(e)
                    except BaseException as e:
                        outcome = f"{type(e).__name__}: {e}"[:200]
                    report[f"{name} {policy} {value_kind} {cfg_kind}"] = [outcome, headroom()]
    sys.stdout.write(json.dumps(report))
    """
)

_DOCS = " (treeclone docs: errors.html#cyclic-tree)"
_EXPECTED = {
    "dict": "cycle detected in pytree: the dict at cfg contains itself at relative key path "
    "['inner']['up']" + _DOCS,
    "list": "cycle detected in pytree: the list at cfg contains itself at relative key path [1]"
    + _DOCS,
    "ordereddict": "cycle detected in pytree: the OrderedDict at cfg contains itself at "
    "relative key path ['self']" + _DOCS,
    "registered": "cycle detected in pytree: the Box at cfg contains itself at relative key "
    "path [<flat index 0>][1]" + _DOCS,
}


@pytest.fixture(scope="module")
def report() -> dict[str, list]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
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


_STATIC_CASES = [
    "jit argnums",
    "jit argnums by keyword",
    "jit argnums first",
    "jit negative argnums",
    "jit argnames",
    "jit argnames positional",
    "checkpoint argnums",
    "checkpoint negative argnums",
]
_STATIC_VALUES = ["plain", "cyclic", "refuses", "unhashable cyclic"]


def _named(case: str) -> str:
    return "args[0]" if case == "jit negative argnums" else "cfg"


@pytest.mark.parametrize("value", _STATIC_VALUES)
@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
@pytest.mark.parametrize("case", _STATIC_CASES)
def test_cycle_beside_static_arguments_is_the_value_error_naming_it(report, case, policy, value):
    """A cyclic dynamic argument beside static ones (``static_argnums``, negative ones,
    ``static_argnames``, naming a parameter passed by position or by keyword) is the same
    ValueError naming it under every policy, whatever the static argument is: even an
    unhashable one, since jax.jit flattens the dynamic arguments before it hashes the static
    ones."""
    outcome, headroom = report[f"{case} {policy} {value} cyclic"]
    assert outcome == _EXPECTED["dict"].replace("at cfg", f"at {_named(case)}")
    assert headroom == 500


@pytest.mark.parametrize("value", _STATIC_VALUES)
@pytest.mark.parametrize("policy", ["clone", "alias", "strict"])
@pytest.mark.parametrize("case", _STATIC_CASES)
def test_static_arguments_are_never_checked(report, case, policy, value):
    """A static argument is hashed, never flattened: one that contains itself, or whose
    flatten raises, is no error beside valid dynamic arguments (an unhashable one of jax.jit
    is jax.jit's ValueError, under every policy)."""
    outcome, headroom = report[f"{case} {policy} {value} plain"]
    if outcome.startswith("skip: "):
        pytest.skip(outcome[len("skip: ") :])
    if value == "unhashable cyclic" and case.startswith("jit"):
        assert outcome.startswith("Non-hashable static arguments are not supported.")
    else:
        assert outcome == "ok [2.0, 2.0]"
    assert headroom == 500
