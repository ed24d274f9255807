"""One version number: Cargo.toml's. pyproject.toml declares the version dynamic, so maturin
writes Cargo.toml's into the package's metadata, and the extension module exports it as
``treeclone.__version__`` (``env!("CARGO_PKG_VERSION")`` in rust/lib.rs)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import treeclone
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_a_pep_440_version():
    assert isinstance(treeclone.__version__, str)
    assert str(Version(treeclone.__version__)) == treeclone.__version__


def test_the_installed_distribution_says_the_same_version():
    try:
        installed = importlib.metadata.version("treeclone")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("treeclone is imported from a folder on sys.path, not installed")
    assert installed == treeclone.__version__


def test_cargo_toml_holds_the_only_version():
    if not (ROOT / "Cargo.toml").is_file():
        pytest.skip("the tests run without the source tree")
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert treeclone.__version__ == cargo
