"""The documentation site (``docs/site/``, Sphinx with MyST): it builds with warnings as errors,
its API reference names every public name, every Python block of its pages runs, and every
error and warning kind treeclone raises has an entry there that its messages point to.

Code blocks: each page's ```` ```python ```` blocks run in order, in one fresh interpreter, as
one script (a page reads as a notebook: a block may use what an earlier one defined). A block
after ``<!-- excerpt: examples/NAME.py -->`` is instead an excerpt of that script (its lines,
in order; the script itself runs in ``tests/test_examples.py``). Output is shown in ```` ```text
```` blocks and shell commands in ```` ```bash ```` blocks, which do not run.

The build needs the ``docs`` extra (``pip install -e '.[docs]'``); without Sphinx the build
tests are skipped (not in CI, ``CI`` set, where the extra is installed), the others still run.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import child_env

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "site"
PACKAGE = ROOT / "python" / "treeclone"
PAGES = sorted(p for p in SITE.rglob("*.md") if "_build" not in p.parts)

FENCE = re.compile(r"^(`{3,})([^\n`]*)\n(.*?)^\1[ \t]*$", re.S | re.M)
EXCERPT = re.compile(r"<!-- excerpt: (examples/[\w.]+) -->\s*$")


def python_blocks(text: str) -> list[tuple[str | None, str]]:
    """``(excerpt source or None, code)`` of each ```` ```python ```` block of ``text``."""
    found = []
    for m in FENCE.finditer(text):
        if m.group(2).strip() != "python":
            continue
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = EXCERPT.search(before)
        found.append((marker.group(1) if marker else None, m.group(3)))
    return found


# --- the build ---------------------------------------------------------------------------------


def build(out: Path) -> subprocess.CompletedProcess:
    """``sphinx -W`` of the site into ``out / "html"``."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(SITE), str(out / "html")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )  # fmt: skip


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path):
    """One build (the slowest part; pytest-xdist would build once per worker for a fixture)
    and what is checked on its output: the pages, the API reference's names and the errors
    page's anchors."""
    if os.environ.get("CI"):  # CI installs the docs extra: there the build must run
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    proc = build(tmp_path)
    assert proc.returncode == 0, f"the site's build failed:\n{proc.stdout}\n{proc.stderr}"
    html = tmp_path / "html"
    for page in ["index", "getting-started", "policies", "errors", "semantics", "benchmarks"]:
        assert (html / f"{page}.html").exists(), page
    assert api_reference_problems(html) == []
    assert missing_anchors(html) == []


def missing_anchors(html: Path) -> list[str]:
    """The anchors of ``_docs.ENTRIES`` (what each message says: ``errors.html#ANCHOR``) that
    are no id of the built errors page."""
    from treeclone import _docs

    ids = set(re.findall(r'id="([^"]+)"', (html / "errors.html").read_text()))
    return sorted(set(_docs.ENTRIES) - ids)


def test_a_broken_reference_fails_the_build(tmp_path: Path):
    """The check itself: a page linking to a missing page or anchor is a failed build."""
    pytest.importorskip("myst_parser")
    (tmp_path / "conf.py").write_text('extensions = ["myst_parser"]\nmyst_heading_anchors = 3\n')
    (tmp_path / "index.md").write_text("# Home\n\n[gone](missing.md) and [here](#nowhere)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(tmp_path),
         str(tmp_path / "_build")],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )  # fmt: skip
    assert proc.returncode != 0 and "missing.md" in proc.stderr, proc.stderr


# --- the API reference -------------------------------------------------------------------------


def public_names() -> set[str]:
    """Every public name of treeclone and its three tree namespaces, fully qualified."""
    import treeclone
    import treeclone.jaxlib_tree_util
    import treeclone.tree
    import treeclone.tree_util

    names = {f"treeclone.{n}" for n in treeclone.__all__}
    for mod in (treeclone.tree_util, treeclone.jaxlib_tree_util):
        names |= {f"{mod.__name__}.{n}" for n in mod.__all__}
    # treeclone.tree has no __all__: its public names are exactly the installed jax.tree's.
    names |= {f"treeclone.tree.{n}" for n in dir(treeclone.tree) if not n.startswith("_")}
    return names


def documented_names(html: Path) -> set[str]:
    """The Python objects of the built site's inventory (``objects.inv``), class members
    apart (``treeclone.Jitted.lower``)."""
    from sphinx.util.inventory import InventoryFile

    with open(html / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    inventory = getattr(inventory, "data", inventory)  # a mapping, or (Sphinx 8.2+) holds one
    names = {n for kind, entries in inventory.items() if kind.startswith("py:") for n in entries}
    return {n for n in names if not any(p[:1].isupper() for p in n.split(".")[:-1])}


NAMESPACES = {"treeclone", "treeclone.tree_util", "treeclone.tree", "treeclone.jaxlib_tree_util"}


def api_reference_problems(html: Path) -> list[str]:
    """Public names the reference lacks, and names of the namespaces it documents that are not
    public (autodoc also registers an object by its defining module's name, treeclone.jit.Jitted:
    those are not in the namespaces)."""
    documented = documented_names(html)
    public = public_names()
    missing = [f"not in the API reference: {n}" for n in sorted(public - documented)]
    in_namespaces = {n for n in documented if n.rpartition(".")[0] in NAMESPACES}
    extra = [f"documented, not public: {n}" for n in sorted(in_namespaces - public - NAMESPACES)]
    return missing + extra


# --- the code blocks ---------------------------------------------------------------------------


def test_every_page_is_in_the_collection():
    assert {p.relative_to(SITE).as_posix() for p in PAGES} >= {
        "index.md",
        "getting-started.md",
        "policies.md",
        "porting/jax.md",
        "porting/nnx.md",
        "porting/equinox.md",
        "transformations.md",
        "errors.md",
        "semantics.md",
        "benchmarks.md",
    }


RUNNABLE = [p for p in PAGES if any(src is None for src, _ in python_blocks(p.read_text()))]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.relative_to(SITE).as_posix())
def test_the_pages_python_blocks_run(page: Path, tmp_path: Path):
    blocks = [code for src, code in python_blocks(page.read_text()) if src is None]
    script = tmp_path / (page.stem.replace("-", "_") + "_blocks.py")
    script.write_text("\n\n".join(blocks))
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert proc.returncode == 0, f"{page.name}'s blocks failed:\n{proc.stdout}\n{proc.stderr}"


def test_the_pages_excerpts_are_taken_from_the_examples():
    for page in PAGES:
        for src, code in python_blocks(page.read_text()):
            if src is None:
                continue
            source = (ROOT / src).read_text().splitlines()
            pos = 0
            for line in filter(str.strip, code.splitlines()):
                assert line in source[pos:], f"{page.name}: excerpt line not in {src}: {line!r}"
                pos = source.index(line, pos) + 1


def test_the_block_reader_sees_fences_markers_and_languages():
    text = (
        "# P\n```python\na = 1\n```\n\n```text\nout\n```\n"
        "<!-- excerpt: examples/policies.py -->\n```python\nimport treeclone\n```\n"
        "````md\n```python\nnot = 'a block'\n```\n````\n"
    )
    assert python_blocks(text) == [
        (None, "a = 1\n"),
        ("examples/policies.py", "import treeclone\n"),
    ]


# --- errors and warnings -----------------------------------------------------------------------


def error_anchors() -> set[str]:
    """The anchors of errors.md's entries (``(anchor)=`` targets)."""
    return set(re.findall(r"^\(([\w-]+)\)=$", (SITE / "errors.md").read_text(), re.M))


def test_every_documented_kind_has_an_entry_and_every_entry_a_kind():
    from treeclone import _docs

    anchors = error_anchors()
    assert set(_docs.ENTRIES) == anchors, (
        f"in _docs.ENTRIES only: {sorted(set(_docs.ENTRIES) - anchors)}; "
        f"in errors.md only: {sorted(anchors - set(_docs.ENTRIES))}"
    )


def test_every_error_and_warning_class_has_an_entry():
    import treeclone

    classes = [
        name
        for name in treeclone.__all__
        if isinstance(getattr(treeclone, name), type)
        and issubclass(getattr(treeclone, name), (Exception, Warning))
    ]
    assert classes
    text = (SITE / "errors.md").read_text()
    for name in classes:
        assert f"`treeclone.{name}`" in text, f"errors.md has no entry for treeclone.{name}"


# A raise of one of these (or a warnings.warn), with a message of treeclone's own, names its
# entry (``see(...)`` in the message). Messages written as JAX writes them (treeclone stands in
# for a JAX function and raises what JAX raises there, compared in the differential tests) are
# listed by their first words; internal errors (RuntimeError) are not checked.
CHECKED = {"ValueError", "TypeError", "MutationError", "PlaceError", "UnsupportedJaxError", "warn"}
AS_JAX_DOES = (
    "if 'operand' keyword is passed",
    "lax.cond: true_fun and false_fun",
    "Non-hashable static arguments",
    "pjit does not support kwargs",
    "One of pjit",
    "Expected a callable value",
    "jit() got an unexpected keyword",
    "the `static_argnums` argument to `jax.checkpoint`",
    "expected function with aux output",
    "differentiating with respect to argnums",
    "argnums must be an int",
    "vmap in_axes must be an int",
    "vmap got inconsistent sizes",
    "vmap must have at least one",
    "vmap was requested to map",
    "vmap has mapped output but out_axes is None",
    "vmap out_axes specification must be",
    "Must specify identity",
    "Mismatch",
    "a leaf has no children",
)


def _message_start(call: ast.Call) -> str:
    """The literal text a raised exception's message starts with ('' if none)."""
    if not call.args:
        return ""
    arg = call.args[0]
    while isinstance(arg, ast.BinOp):
        arg = arg.left
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        return "".join(
            v.value for v in arg.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    return ""


def unpointed_raises(source: str) -> list[tuple[int, str]]:
    """``(line, start of message)`` of each raise in ``source`` of a CHECKED class built in
    place with a literal message that neither calls ``see(...)`` nor is one of JAX's."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        if name not in CHECKED or not node.args:
            continue
        calls = {getattr(n.func, "id", getattr(n.func, "attr", None)) for n in ast.walk(node)
                 if isinstance(n, ast.Call)}  # fmt: skip
        start = _message_start(node)
        if "see" in calls or not start or start.startswith(AS_JAX_DOES):
            continue
        found.append((node.lineno, start[:60]))
    return found


def test_every_message_of_treeclones_own_points_to_its_entry():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "bench" in path.relative_to(PACKAGE).parts:
            continue
        for line, start in unpointed_raises(path.read_text()):
            missing.append(f"{path.relative_to(ROOT)}:{line}: {start!r}")
    assert not missing, "messages without a pointer to docs/site/errors.md:\n" + "\n".join(missing)


def test_the_pointer_check_finds_a_message_without_one():
    source = (
        "raise ValueError(f'{x} is bad')\n"
        "raise ValueError(see('x', 'fine'))\n"
        "raise TypeError('Mismatch of trees')\n"
        "raise RuntimeError('internal')\n"
    )
    assert unpointed_raises(source) == [(1, " is bad")]


def test_the_pointer_names_an_entry_and_reads_the_same_everywhere():
    from treeclone import _docs

    assert _docs.see("mutation-error", "text.") == (
        "text. (treeclone docs: errors.html#mutation-error)"
    )
    with pytest.raises(KeyError):
        _docs.see("no-such-entry", "text.")
    for anchor in _docs.ENTRIES:
        assert re.fullmatch(r"[a-z][a-z-]*", anchor), anchor


OUTPUT = re.compile(r"<!-- output: (examples/[\w.]+) -->\s*\n```text\n(.*?)```", re.S)


def test_the_pages_output_blocks_are_what_the_examples_print():
    from test_examples import _example_output

    shown = [(page, m) for page in PAGES for m in OUTPUT.findall(page.read_text())]
    assert shown
    for page, (path, block) in shown:
        printed = set(_example_output(Path(path).name).splitlines())
        for line in block.splitlines():
            assert line in printed, f"{page.name} shows {line!r}, which {path} does not print"
