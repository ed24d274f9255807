"""Sizes in ``python/treeclone`` (issue 58): no module over 600 lines, no function over 80 code
lines, so that each can be read whole.

A module's size is its number of lines, all of them. A function's (a method's, a nested
function's) is its code lines from its ``def`` line to its last line: a line is a code line when
a token other than a comment is on it, so blank lines and lines holding only a comment are out,
and every line of a string is in, a docstring's included (a reader reads it with the code).
Decorators are not counted. A nested function counts in its enclosing function's size and is
measured on its own too.

Read from the source with ``ast`` and ``tokenize`` (nothing is imported). The exceptions below
are files other work is splitting now: the lists only shrink, and each entry must still be
needed (a test fails when one is within its limit or gone, so that it is removed).
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "treeclone"

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Module (relative to the repository) -> who splits it. Only ever shrinks.
MODULE_EXCEPTIONS: Mapping[str, str] = {}

# "module::qualified.name" -> who splits it. Only ever shrinks.
FUNCTION_EXCEPTIONS: Mapping[str, str] = {}

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> set[int]:
    """The numbers (from 1) of the lines of ``source`` that hold part of a token other than a
    comment: every line a string spans, none that is blank or only a comment."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of a module, methods and nested functions included, with its qualified
    name (``Class.method``, ``outer.inner``)."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from visit(child, f"{name}.")
            else:
                yield from visit(child, prefix)

    for name, node in visit(tree, ""):
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        yield name, node


def function_sizes(source: str) -> dict[str, int]:
    """``{qualified name: code lines}`` of every function in ``source`` (a name defined twice,
    as a property's getter and setter, keeps its largest)."""
    code = code_lines(source)
    sizes: dict[str, int] = {}
    for name, node in functions(ast.parse(source)):
        end = node.end_lineno or node.lineno
        size = sum(1 for line in range(node.lineno, end + 1) if line in code)
        sizes[name] = max(size, sizes.get(name, 0))
    return sizes


def modules() -> dict[str, str]:
    """``{path relative to the repository: source}`` of every module of the package."""
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
    }


SOURCES = modules()
MODULE_SIZES = {path: len(source.splitlines()) for path, source in SOURCES.items()}
FUNCTION_SIZES = {
    f"{path}::{name}": size
    for path, source in SOURCES.items()
    for name, size in function_sizes(source).items()
}


def test_the_package_is_read() -> None:
    assert "python/treeclone/policies.py" in MODULE_SIZES
    assert "python/treeclone/policies.py::as_policy" in FUNCTION_SIZES


def test_no_module_is_over_the_limit() -> None:
    found = [
        f"{path}: {size} lines"
        for path, size in sorted(MODULE_SIZES.items())
        if size > MAX_MODULE_LINES and path not in MODULE_EXCEPTIONS
    ]
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split them):\n" + "\n".join(found)


def test_no_function_is_over_the_limit() -> None:
    found = [
        f"{where}: {size} code lines"
        for where, size in sorted(FUNCTION_SIZES.items())
        if size > MAX_FUNCTION_LINES and where not in FUNCTION_EXCEPTIONS
    ]
    assert not found, (
        f"functions over {MAX_FUNCTION_LINES} code lines (blank and comment-only lines aside; "
        "split them):\n" + "\n".join(found)
    )


def test_every_exception_is_still_needed() -> None:
    stale = [
        path for path in MODULE_EXCEPTIONS if MODULE_SIZES.get(path, 0) <= MAX_MODULE_LINES
    ] + [
        where for where in FUNCTION_EXCEPTIONS if FUNCTION_SIZES.get(where, 0) <= MAX_FUNCTION_LINES
    ]
    assert not stale, "exceptions no longer needed (remove them):\n" + "\n".join(stale)


# --- the counting itself ------------------------------------------------------------------------

_SAMPLE = '''
import functools


@functools.cache
def outer(x):
    """A docstring

    of three lines."""
    # a comment: not counted

    def inner():
        return x  # a trailing comment: the line counts

    return inner


class Box:
    def method(self):
        return (
            1
        )
'''


def test_code_lines_are_counted() -> None:
    assert function_sizes(_SAMPLE) == {"outer": 7, "outer.inner": 2, "Box.method": 4}
