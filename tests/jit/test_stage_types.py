"""treeclone's ahead-of-time stages are ``jax.stages`` objects (docs/semantics.md, "Ahead of
time"): under every policy, ``traced=`` and ``jit_partial``, ``.trace(...)``, ``.lower(...)``
and ``.compile()`` are instances of ``jax.stages.Traced``, ``Lowered`` and ``Compiled``, every
public name of those classes answers on them and shows in ``dir()``, as on jax.jit's; so a
library that annotates or checks the types (equinox's ``filter_jit(...).lower()``) runs with
treeclone.jit as its engine. Runs on every JAX release CI tests (tests/compat_subset.txt)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc

STAGES = {"trace": jax.stages.Traced, "lower": jax.stages.Lowered, "compile": jax.stages.Compiled}


def _step(state: dict, x: jax.Array) -> jax.Array:
    state["w"] = state["w"] + x
    return state["w"].sum()


def _pure(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
    w = state["w"] + x
    return {"w": w}, w.sum()


def _args() -> tuple[dict, jax.Array]:
    return {"w": jnp.zeros(3)}, jnp.ones(3)


# name -> (the jitted function, the arguments its stages take)
def _jitted(kind: str) -> tuple[Any, tuple]:
    state, x = _args()
    if kind == "jit_partial":
        return tc.jit_partial(_step, state, policy="alias"), (x,)
    options: dict[str, Any] = {
        "clone": {"policy": "clone"},
        "alias": {"policy": "alias"},
        "strict": {"policy": "strict"},
        "per-argument": {"policy": {"state": "alias", ...: "strict"}},
        "traced=arrays": {"policy": "alias", "traced": "arrays"},
    }[kind]
    fun = _pure if kind in ("clone", "strict") else _step
    return tc.jit(fun, **options), (state, x)


KINDS = ["clone", "alias", "strict", "per-argument", "traced=arrays", "jit_partial"]


def _stages(jitted: Any, args: tuple) -> dict[str, Any]:
    traced = jitted.trace(*args)
    lowered = jitted.lower(*args)
    return {"trace": traced, "lower": lowered, "compile": lowered.compile()}


def _public(x: Any) -> set[str]:
    return {n for n in dir(x) if not n.startswith("_")}


@pytest.mark.parametrize("kind", KINDS)
def test_every_stage_is_a_jax_stages_object_with_jax_s_names(kind: str) -> None:
    """``isinstance(stage, jax.stages.X)`` holds for each stage, as for jax.jit's; every public
    name jax.jit's stage has shows in ``dir()`` and answers (the methods jax.stages documents
    give what the inner stage gives); the stages still run the jitted call."""
    jitted, args = _jitted(kind)
    ours = _stages(jitted, args)
    theirs = _stages(jax.jit(_pure), _args())
    for name, cls in STAGES.items():
        assert isinstance(theirs[name], cls)
        assert isinstance(ours[name], cls), (name, type(ours[name]).__mro__)
        missing = _public(theirs[name]) - _public(ours[name])
        assert not missing, (name, missing)
        for attr in _public(theirs[name]):
            if attr != "call":  # (Compiled.call: a static method taking jax's parameters)
                getattr(ours[name], attr)  # answers, raising nothing
    lowered, compiled = ours["lower"], ours["compile"]
    assert "stablehlo" in lowered.as_text() or "module" in lowered.as_text()
    assert isinstance(compiled.as_text(), str)
    assert (compiled.cost_analysis() is None) == (theirs["compile"].cost_analysis() is None)
    assert (compiled.memory_analysis() is None) == (theirs["compile"].memory_analysis() is None)
    assert isinstance(lowered.compile(), jax.stages.Compiled)
    assert isinstance(ours["trace"].lower(), jax.stages.Lowered)
    # In the user's structure, as jax.jit's.
    if kind != "jit_partial":
        for name in STAGES:
            assert ours[name].in_tree == theirs[name].in_tree
            assert ours[name].args_info == theirs[name].args_info
        assert compiled.input_shardings == theirs["compile"].input_shardings
    # And called, the jitted call.
    state, x = _args()
    call_args = (x,) if kind == "jit_partial" else (state, x)
    out = compiled(*call_args)
    np.testing.assert_allclose(out[1] if isinstance(out, tuple) else out, 3.0)


def test_a_stage_copied_or_missing_an_attribute_says_so() -> None:
    """The jax base classes' attributes are not set on treeclone's stages (their ``__init__``
    is not run): reading one that neither has is an AttributeError naming it, not a
    recursion, and a copy of a stage is a stage."""
    import copy

    lowered = tc.jit(_step, policy="alias").lower(*_args())
    with pytest.raises(AttributeError, match="no_such_name"):
        lowered.no_such_name  # noqa: B018
    copied = copy.copy(lowered)
    assert isinstance(copied, jax.stages.Lowered)
    assert copied.in_tree == lowered.in_tree


# --- equinox's ahead-of-time path with treeclone.jit as its engine -----------------------------


class _JaxWithTreecloneJit:
    """The ``jax`` a library sees when its ``jax.jit(f, ...)`` calls are replaced by
    ``treeclone.jit(f, policy=..., ...)`` (as a user swapping the engine would); every other
    name is jax's."""

    def __init__(self, policy: str) -> None:
        self._policy = policy

    def jit(self, fun: Any = None, **options: Any) -> Any:
        return tc.jit(fun, policy=self._policy, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)


def _check_annotations(module: Any) -> None:
    """What a runtime type checker (jaxtyping's, in equinox's own tests) checks of an
    ``eqx.Module``'s fields annotated with a class: each field is an instance of it."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(type(module))
    for field in dataclasses.fields(module):
        hint = hints.get(field.name)
        if isinstance(hint, type) and hint.__module__.startswith("jax"):
            value = getattr(module, field.name)
            assert isinstance(value, hint), (field.name, type(value), hint)


@pytest.mark.parametrize("policy", ["alias", "strict"])
@pytest.mark.parametrize("donate", ["all", "all-except-first", "none"])
def test_equinox_aot_runs_on_treeclone_jit_as_on_jax_jit(
    policy: str, donate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``eqx.filter_jit(f).lower(...)`` builds ``equinox._compile_utils.Lowered``, whose
    ``lowered`` field is annotated ``jax.stages.Lowered`` (checked by jaxtyping in equinox's
    tests), and ``.compile()`` an ``eqx`` ``Compiled`` holding a ``jax.stages.Compiled``:
    with equinox's ``jax.jit`` replaced by ``treeclone.jit``, both hold, and the compiled call
    (positional, keyword and ``compiler_options``) gives what it gives on jax.jit."""
    eqx = pytest.importorskip("equinox")
    import equinox._jit as eqx_jit

    def run() -> tuple[Any, Any, Any]:
        def f(x: jax.Array, y: int, *, scale: jax.Array) -> jax.Array:
            return 2 * x + y * scale  # (a new function: equinox caches its jax.jit by it)

        def args() -> tuple[jax.Array, int]:  # (new arrays each call: some are donated)
            return jnp.array(3.0), 4

        lowered = eqx.filter_jit(f, donate=donate).lower(*args(), scale=jnp.array(0.5))
        assert "module" in lowered.as_text()
        compiled = lowered.compile()
        options = lowered.compile(compiler_options={"xla_embed_ir_in_executable": True})
        outs = [c(*args(), scale=jnp.array(0.5)) for c in (compiled, options)]
        return lowered, compiled, outs

    _, _, theirs = run()
    monkeypatch.setattr(eqx_jit, "jax", _JaxWithTreecloneJit(policy))
    lowered, compiled, ours = run()
    assert isinstance(lowered.lowered, tc._jit.stages.Lowered)  # treeclone's engine ran
    _check_annotations(lowered)
    _check_annotations(compiled)
    np.testing.assert_allclose(ours, theirs)
