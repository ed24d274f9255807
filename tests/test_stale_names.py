"""Comments, docstrings, the native stub and the docs name only treeclone files, modules and
classes that exist.

What is read (nothing is imported): the comments and docstrings of every Python file of
``python/treeclone`` (the stub ``_native.pyi`` included), ``tests``, ``benches`` and
``examples``; the ``//`` comments of every Rust file; all of ``README.md`` and ``docs/**/*.md``.

What counts as naming something of treeclone's:

- a path to one of its files or folders: ``rust/call/partial.rs``, ``_lift/axes.py``,
  ``tests/support/``, ``member.rs``. A path with a folder must end the path of a file (or
  folder) of the repository; a relative link (``../semantics.md``) is read from the page's own
  folder; a bare file name must be some file's name and, in a Rust comment, a Rust file's (a
  Python file is named from ``rust/`` with its folder: ``_jit/partial.py``). A path that starts
  elsewhere (``jax/_src/core.py``, flax's ``benchmarks/...``) is not treeclone's; one with a
  placeholder in capitals (``examples/NAME.py``) names no file;
- a dotted name in backticks that starts at the package, ``treeclone`` or one of its private
  modules: ``treeclone._effects.steps``, ``_jit.placement``, ``_native.running_call``. Each module
  on the way must exist, the name after the last one must be bound there, and where that is a
  class, the name after it must be one of the class's;
- a private class name in backticks (``_TraceInfo``, also inside a dotted name: ``jit._Inner``)
  or after ``class``/``struct``/``enum``: defined in ``python/treeclone``, in ``rust/`` or in
  the file that names it;
- a private name alone in backticks (``_calls``, ``_init_partial``): defined there too, or one of
  the few private names of other libraries that the sources name (``EXTERNAL_PRIVATE``);
- a method or attribute of one of the package's classes (``Prepared.call``,
  ``JitPartial._init_partial``), where the class is defined once and has no base but the
  package's own;
- in a Rust comment, a CamelCase name in backticks (``SlotReader``): a Rust or Python name of
  treeclone's, a Python builtin, one of CPython's C API or pyo3's (``Py...``), or in
  ``EXTERNAL_RUST``.

Public names in Python comments and docs (``NamedSharding``, ``BatchNorm``) are left alone:
they are JAX's, flax's and equinox's as often as treeclone's.
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "treeclone"
SKIP_DIRS = {"target", "_build", "__pycache__", ".git", ".venv", "node_modules"}

# Private names of other libraries that a comment names alone, in backticks -> whose.
EXTERNAL_PRIVATE = {
    "_fields": "a namedtuple's",
    "_registry": "jax.tree_util's registry",
    "_out_tree": "a jax.stages.Wrapped's",
    "_lowering": "a jax.stages.Stage's",
    "_executable": "a jax.stages.Compiled's",
    "_raw_value": "flax nnx Variable's",
    "_var_metadata": "flax nnx Variable's",
    "_mapping": "flax nnx State's",
    "_pytree__state": "flax nnx Pytree's",
    "_pytree__nodes": "flax nnx Pytree's",
    "_pytree__has_int_keys": "flax nnx Pytree's",
    "_flatten_pytree_state": "flax.nnx.pytreelib's",
    "_state_flatten": "flax.nnx.statelib's",
    "_variable_flatten": "flax.nnx.variablelib's",
    "_pytree__flatten": "flax nnx Pytree's",
    "_maybe_int": "flax.nnx.pytreelib's",
    "_initializing": "flax nnx PytreeState's",
    "_is_setup": "flax nnx PytreeState's",
}
# CamelCase names of other libraries in Rust comments -> whose.
EXTERNAL_RUST = {"HashableMapping": "flax's"}
# Bare file names that name no file of the repository -> what they are.
NOT_FILES = {
    "report.md": "the file the benchmark harness writes",
    "step.py": "a user's file, in an example of JAX's message",
}
# Paths under treeclone's folder names that are another project's -> whose.
EXTERNAL_PATHS = {"tests/nnx/transforms_test.py": "flax's"}

PATH = re.compile(r"(?<![\w/.\-])((?:\.{1,2}/)*(?:[\w.\-]+/)*[\w\-]+\.(?:pyi|py|rs|md|toml))\b")
FOLDER = re.compile(r"`((?:\.{1,2}/)*[\w.\-]+/(?:[\w.\-]+/)*)`")
CODE = re.compile(r"`+([^`\n]+?)`+")
DOTTED = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PRIVATE_CLASS = re.compile(r"(?<![\w])_[A-Z][A-Za-z0-9]*\b")
AFTER_KEYWORD = re.compile(r"\b(?:class|struct|enum)\s+`?(_[A-Z][A-Za-z0-9]*)\b")
PRIVATE_ALONE = re.compile(r"_[a-z]\w*(?:\(\))?")
CAMEL = re.compile(r"(?<![\w.])[A-Z][a-z0-9]+[A-Z]\w*")


# --- what the repository holds --------------------------------------------------------------


def _walk(top: Path) -> Iterator[Path]:
    for path in sorted(top.iterdir()):
        if path.name in SKIP_DIRS or path.name.startswith("."):
            continue
        yield path
        if path.is_dir():
            yield from _walk(path)


@cache
def repository() -> tuple[frozenset[str], frozenset[str]]:
    """The repository's files and folders, as paths relative to its root."""
    files, folders = set(), set()
    for path in _walk(ROOT):
        rel = path.relative_to(ROOT).as_posix()
        (folders if path.is_dir() else files).add(rel)
    return frozenset(files), frozenset(folders)


def python_names(tree: ast.AST) -> set[str]:
    """Every name a Python file binds: its functions, classes, variables, arguments, attributes
    set on an object, imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def rust_names(text: str) -> set[str]:
    """The names a Rust file defines: items, fields and variants, pyo3's Python names."""
    names = set(re.findall(r"\b(?:struct|enum|fn|trait|type|const|static|mod|union)\s+(\w+)", text))
    names |= set(re.findall(r"^\s*(?:pub(?:\([\w:]+\))?\s+)?(\w+)\s*[:({,]", text, re.M))
    names |= set(re.findall(r"\bname\s*=\s*\"(\w+)\"", text))
    return names


@cache
def package_files() -> tuple[Path, ...]:
    return (*sorted(PACKAGE.rglob("*.py")), PACKAGE / "_native.pyi")


@cache
def treeclone_names() -> frozenset[str]:
    """The names ``python/treeclone`` (stub included) and ``rust/`` define, and their modules'."""
    names: set[str] = set()
    for path in package_files():
        names |= python_names(ast.parse(path.read_text(encoding="utf-8")))
        names.add(path.stem)
    for path in sorted((ROOT / "rust").rglob("*.rs")):
        names |= rust_names(path.read_text(encoding="utf-8"))
        names.add(path.stem)
    return frozenset(names)


def _top_level(tree: ast.Module) -> dict[str, ast.AST | None]:
    """A module's top-level names -> their class (None for anything else)."""
    found: dict[str, ast.AST | None] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                found[node.name] = node
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[node.name] = None
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    found[(alias.asname or alias.name).split(".")[0]] = None
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            found[name.id] = None
            elif isinstance(node, (ast.If, ast.Try)):  # ``if TYPE_CHECKING:``, ``try: import``
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def _class_names(cls: ast.AST) -> set[str]:
    """What a class has: names bound in its body, its methods, what they set on ``self``."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


@cache
def _module(dotted: str) -> dict[str, ast.AST | None] | None:
    """The top-level names of the treeclone module ``dotted`` (None: no such module)."""
    parts = dotted.split(".")[1:]
    base = PACKAGE.joinpath(*parts)
    for path in (base / "__init__.py", base.with_suffix(".py"), base.with_suffix(".pyi")):
        if path.is_file():
            names = _top_level(ast.parse(path.read_text(encoding="utf-8")))
            if path.name == "__init__.py":  # its submodules are its names too
                names |= {p.name.split(".")[0]: None for p in base.iterdir()}
            return names
    return None


def resolve_dotted(dotted: str) -> bool:
    """Whether ``treeclone.a.b.c`` exists: modules, then a name bound in the last of them,
    then, where that is a class, one of the class's names."""
    parts = dotted.split(".")
    module = parts[0]
    names = _module(module)
    assert names is not None
    rest = parts[1:]
    while rest and _module(f"{module}.{rest[0]}") is not None:
        module = f"{module}.{rest.pop(0)}"
        names = _module(module)
        assert names is not None
    if not rest:
        return True
    if rest[0] not in names:
        return False
    cls = names[rest[0]]
    return cls is None or len(rest) == 1 or rest[1] in _class_names(cls)


@cache
def own_classes() -> dict[str, set[str]]:
    """The package's classes defined once, with no base but the package's own (a subclass of
    ``jax.stages.Compiled`` has names this cannot see) -> their names and their bases'."""
    found: dict[str, list[ast.ClassDef]] = {}
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    unique = {name: nodes[0] for name, nodes in found.items() if len(nodes) == 1}

    def names(cls: ast.ClassDef, seen: frozenset[str] = frozenset()) -> set[str] | None:
        own = _class_names(cls)
        for base in cls.bases:
            module, _, base_name = ast.unparse(base).rpartition(".")
            if not module and base_name in ("object", "tuple", "Generic", "Protocol"):
                continue
            ours = not module or module.split(".")[0] in {"treeclone", *private_modules()}
            if not ours or base_name not in unique or base_name in seen:
                return None
            inherited = names(unique[base_name], seen | {cls.name})
            if inherited is None:
                return None
            own |= inherited
        return own

    classes = {name: names(cls) for name, cls in unique.items()}
    return {name: members for name, members in classes.items() if members is not None}


@cache
def private_modules() -> frozenset[str]:
    """The package's private top-level modules and subpackages (``_effects``, ``_native``)."""
    return frozenset(
        p.name.split(".")[0]
        for p in PACKAGE.iterdir()
        if p.name.startswith("_") and not p.name.startswith("__") and p.suffix != ".so"
    )


# --- what the sources say -------------------------------------------------------------------


def python_prose(text: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, each with its first line."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return sorted(found)


def rust_prose(text: str) -> list[tuple[int, str]]:
    """The ``//`` comments of a Rust file (a ``//`` inside a string literal is not one)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        in_string, i = False, 0
        while i < len(line) - 1:
            if line[i] == "\\" and in_string:
                i += 2
                continue
            if line[i] == '"':
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                found.append((number, line[i:]))
                break
            i += 1
    return found


def sources() -> Iterator[tuple[Path, list[tuple[int, str]]]]:
    """Each file read, with its prose; this one aside, whose examples name what is gone."""
    for top in ("python/treeclone", "tests", "benches", "examples"):
        for path in sorted((ROOT / top).rglob("*.py*")):
            if path.suffix in (".py", ".pyi") and path != Path(__file__).resolve():
                yield path, python_prose(path.read_text(encoding="utf-8"))
    for path in [ROOT / "build.rs", *sorted((ROOT / "rust").rglob("*.rs"))]:
        yield path, rust_prose(path.read_text(encoding="utf-8"))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if "_build" not in path.parts:
            yield path, list(enumerate(path.read_text(encoding="utf-8").splitlines(), 1))


# --- the checks -----------------------------------------------------------------------------


def _ours(first: str) -> bool:
    """Whether a path that starts with the folder ``first`` is one of treeclone's: a folder of
    the repository's (``rust``, ``_lift``, ``call``) or a private one (a package's, gone)."""
    _, folders = repository()
    return first.startswith("_") or any(f.rsplit("/", 1)[-1] == first for f in folders)


def path_problem(ref: str, naming: Path) -> str | None:
    """What is wrong with the path ``ref`` named in the file ``naming`` (None: nothing)."""
    files, folders = repository()
    parts = ref.rstrip("/").split("/")
    if any(p.isupper() or (p.split(".")[0].isupper() and len(p) > 3) for p in parts):
        return None  # a placeholder: ``examples/NAME.py``, ``OUT_DIR/floor.md``
    if ref in EXTERNAL_PATHS:
        return None
    if parts[0] in (".", ".."):
        target = (naming.parent / ref).resolve()
        return None if target.exists() else f"{ref} (from {naming.parent.name}/) is not there"
    tail = ref.rstrip("/")
    if ref.endswith("/"):
        if not _ours(parts[0]) or any(f == tail or f.endswith("/" + tail) for f in folders):
            return None
        return f"{ref} is no folder of the repository"
    if len(parts) > 1:
        if not _ours(parts[0]):
            return None
        if any(f == tail or f.endswith("/" + tail) for f in files):
            return None
        return f"{ref} is no file of the repository"
    if ref in NOT_FILES:
        return None
    same_name = [f for f in files if f.rsplit("/", 1)[-1] == ref]
    if not same_name:
        return f"{ref} is no file of the repository"
    if naming.suffix == ".rs" and not any(f.endswith(".rs") or "/" not in f for f in same_name):
        return f"{ref} is a Python file named from Rust: give its folder ({same_name[0]})"
    return None


def code_problems(code: str, own: frozenset[str], rust: bool) -> Iterator[str]:
    """What is wrong with the names of one piece of code in backticks."""
    known = treeclone_names() | own
    for dotted in DOTTED.findall(code):
        first, *_, last = dotted.split(".")
        if last in ("py", "pyi", "rs", "md", "toml"):
            continue  # a file: ``_docs.py``
        if first == "treeclone":
            full = dotted
        elif first in private_modules():
            full = f"treeclone.{dotted}"
        else:
            continue
        if not resolve_dotted(full):
            yield f"{dotted}: no such name in treeclone"
    for dotted in DOTTED.findall(code):
        parts = dotted.split(".")
        cls, name = parts[0], parts[1]
        if cls in own_classes() and not name.startswith("__"):
            if name not in own_classes()[cls]:
                yield f"{cls}.{name}: {cls} has no {name}"
    for name in PRIVATE_CLASS.findall(code):
        if name not in known:
            yield f"{name}: no such class"
    alone = PRIVATE_ALONE.fullmatch(code.strip())
    if alone:
        name = code.strip().removesuffix("()")
        if name not in known and name not in EXTERNAL_PRIVATE:
            yield f"{name}: no such name"
    if rust:
        for name in CAMEL.findall(code):
            if (
                name not in known
                and name not in EXTERNAL_RUST
                and not name.startswith("Py")
                and not hasattr(builtins, name)
            ):
                yield f"{name}: no such Rust or Python name"


@cache
def own_names(path: Path) -> frozenset[str]:
    """The names a Python file of the tests, benches or examples defines itself."""
    if path.suffix != ".py" or PACKAGE in path.parents or not path.is_file():
        return frozenset()
    return frozenset(python_names(ast.parse(path.read_text(encoding="utf-8"))))


def problems(path: Path, prose: list[tuple[int, str]]) -> Iterator[str]:
    rel = path.relative_to(ROOT).as_posix()
    rust = path.suffix == ".rs"
    own = own_names(path)
    for first, text in prose:
        for offset, line in enumerate(text.splitlines()):
            where = f"{rel}:{first + offset}"
            for ref in [*PATH.findall(line), *FOLDER.findall(line)]:
                found = path_problem(ref, path)
                if found:
                    yield f"{where}: {found}"
            for code in CODE.findall(line):
                for found in code_problems(code, own, rust):
                    yield f"{where}: {found}"
            for name in AFTER_KEYWORD.findall(line):
                if name not in treeclone_names() | own:
                    yield f"{where}: {name}: no such class"


def test_nothing_stale_is_named() -> None:
    found = sorted({p for path, prose in sources() for p in problems(path, prose)})
    assert not found, "names of things that are gone (or never were):\n" + "\n".join(found)


def test_every_allowed_external_name_is_still_named() -> None:
    """The allowlists only shrink: each entry is still named somewhere."""
    everything = "\n".join(text for _, prose in sources() for _, text in prose)
    unused = [
        name
        for name in [*EXTERNAL_PRIVATE, *EXTERNAL_RUST, *NOT_FILES, *EXTERNAL_PATHS]
        if name not in everything
    ]
    assert not unused, unused


# --- the checker itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "naming", "expected"),
    [
        ("`_lift/naming.py`, `treeclone._effects.steps`, `_native.running_call`", "x.py", []),
        (
            "`rust/call/partial.rs`, `call/lean/key.rs`, `tests/support/`, ../semantics.md",
            "docs/site/x.md",
            [],
        ),
        ("`treeclone.Jitted`, `treeclone.jit`, `_jit.inner.Inner.__call__`", "x.py", []),
        ("`jax._src.core`, `self._x`, `jax/_src/core.py`, `examples/NAME.py`", "x.py", []),
        ("`_fields`, `NamedSharding`, `BatchNorm`", "x.py", []),
        ("`member.rs`", "x.py", ["member.rs is no file"]),
        ("`rust/member.rs`", "x.py", ["rust/member.rs is no file"]),
        ("`_lift/gone.py`", "x.py", ["_lift/gone.py is no file"]),
        ("(`partial.py`)", "rust/x.rs", ["partial.py is a Python file named from Rust"]),
        ("`treeclone._effects.gone`", "x.py", ["treeclone._effects.gone: no such name"]),
        ("`_jit.inner.Inner.gone`", "x.py", ["_jit.inner.Inner.gone: no such name"]),
        ("`_TraceInfo`, `jit._Inner`", "x.py", ["_TraceInfo: no such class", "_Inner: no such"]),
        ("a `_Call`", "rust/x.rs", ["_Call: no such class"]),
        ("class _Gone", "x.py", ["_Gone: no such class"]),
        ("(``_calls``)", "x.py", ["_calls: no such name"]),
        ("`SlotReader`, `PyDict`, `TypeError`", "rust/x.rs", []),
        ("`GoneReader`", "rust/x.rs", ["GoneReader: no such Rust or Python name"]),
        ("`Prepared.call`, `CallShape.refuse()`, `StagedCall.refuse`", "x.py", []),
        ("`Prepared.gone`", "x.py", ["Prepared.gone: Prepared has no gone"]),
    ],
)
def test_the_check(text: str, naming: str, expected: list[str]) -> None:
    found = list(problems(ROOT / naming, [(1, text)]))
    assert len(found) == len(expected), found
    for got, want in zip(found, expected, strict=True):
        assert want in got, (got, want)
