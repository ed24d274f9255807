"""Sphinx configuration of treeclone's documentation site (MyST Markdown, autodoc, napoleon).

Build (warnings are errors, as in CI: ``tests/test_docs_site.py``)::

    python -m sphinx -W --keep-going -b html docs/site docs/site/_build/html

The package is imported from ``python/`` (the source tree, with its built native module) when
it is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
try:
    import treeclone
except ImportError:  # the source tree, not installed
    sys.path.insert(0, str(ROOT / "python"))
    import treeclone

project = "treeclone"
author = "the treeclone authors"
copyright = "the treeclone authors, Apache-2.0"
release = treeclone.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Anchors for the headings of the included documents (semantics.md, benchmarks.md), so that
# their section links (#rules) resolve.
myst_heading_anchors = 4
# Suppressed: the included documents' own heading structure (semantics.md and benchmarks.md are
# kept as they are, read on GitHub too).
suppress_warnings = ["myst.header"]

autodoc_default_options = {"members": False, "undoc-members": False}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = True

# Offline: no intersphinx, no external fetches.
html_theme = "furo" if __import__("importlib").util.find_spec("furo") else "alabaster"
html_title = f"treeclone {release}"
html_static_path: list[str] = []
