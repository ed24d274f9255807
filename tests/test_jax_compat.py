"""The JAX range treeclone declares, and what happens on a JAX release it has not seen: every
internal it reads is probed in ``_jax_compat``, and a probe that finds nothing fails with
``UnsupportedJaxError`` naming the missing attribute and the installed JAX version."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import treeclone
from helpers import child_env
from packaging.requirements import Requirement
from treeclone import _jax_compat

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {r.name: r for r in reqs}


@pytest.mark.parametrize("package", ["jax", "jaxlib"])
@pytest.mark.parametrize("version", ["0.6.2", "0.10.2", "0.11.2", "0.12.0", "1.0.0"])
def test_declared_range_admits_current_jax(package, version):
    assert _requirements()[package].specifier.contains(version)


@pytest.mark.parametrize("package", ["jax", "jaxlib"])
def test_declared_range_starts_at_the_oldest_tested_release(package):
    spec = _requirements()[package].specifier
    assert not spec.contains("0.6.1")
    assert ".".join(map(str, _jax_compat.MIN_JAX)) == "0.6.2"


def test_requires_python_matches_what_is_tested():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    tested = {c.rsplit(" ", 1)[-1] for c in project["classifiers"] if ":: Python :: 3." in c}
    assert tested == {"3.11", "3.12", "3.13"}


def test_a_missing_internal_names_itself_and_the_jax_version():
    missing = _jax_compat.internal("jax._src.core", "no_such_attribute_in_any_jax")
    assert not missing
    for use in (missing, lambda: missing.anything, lambda: _jax_compat.require(missing)):
        with pytest.raises(treeclone.UnsupportedJaxError) as info:
            use()
        assert "jax._src.core.no_such_attribute_in_any_jax" in str(info.value)
        assert f"jax {jax.__version__}" in str(info.value)
    assert issubclass(treeclone.UnsupportedJaxError, ImportError)


def test_a_missing_module_names_itself():
    missing = _jax_compat.internal("jax._src.no_such_module", "thing")
    with pytest.raises(treeclone.UnsupportedJaxError, match=r"jax\._src\.no_such_module\.thing"):
        missing()


def test_a_present_internal_is_jaxs_own():
    assert _jax_compat.internal("jax.tree_util", "tree_map") is jax.tree_util.tree_map
    assert _jax_compat.require(jax.tree_util.tree_map) is jax.tree_util.tree_map


def test_import_fails_naming_the_registry_when_jax_moved_it():
    code = textwrap.dedent(
        """
        import jax, jax._src.tree_util as jtu
        del jtu._registry
        try:
            import treeclone
        except ImportError as exc:
            print(type(exc).__name__, "|", exc)
        else:
            print("imported")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=child_env(),
    ).stdout
    assert out.startswith("UnsupportedJaxError |"), out
    assert "jax._src.tree_util._registry" in out
    assert f"jax {jax.__version__}" in out


def test_vmap_under_alias_fails_loudly_without_the_batch_tracer(monkeypatch):
    # vmap's face (the module that reads the tracer type): treeclone.vmap is the function.
    vmap_module = importlib.import_module("treeclone.vmap.batched")

    missing = _jax_compat.internal("jax._src.interpreters.batching", "NoBatchTracer")
    monkeypatch.setattr(vmap_module, "_BatchTracer", missing)

    def f(state, x):
        state["n"] = state["n"] + x.sum()
        return x

    state = {"n": jnp.zeros(())}
    with pytest.raises(treeclone.UnsupportedJaxError, match="NoBatchTracer"):
        treeclone.vmap(f, in_axes=(None, 0), policy="alias")(state, jnp.ones((3, 2)))
    assert float(state["n"]) == 0.0  # nothing half-applied
