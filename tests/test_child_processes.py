"""Every Python child a test starts runs on the CPU: its environment comes from
``helpers.child_env`` (``JAX_PLATFORMS=cpu``). One process at a time can hold a TPU, so a child
that opened the accelerator the pytest process holds would fail there, and only there.

Read from the source with ``ast``: each ``subprocess.run``/``Popen``/``check_output``/``call``
whose command names ``sys.executable`` must pass ``env=``, and its function (or module) must
build that environment with ``child_env(...)``.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LAUNCHERS = {"run", "Popen", "check_output", "check_call", "call"}


def _names_sys_executable(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == "executable"
        and isinstance(n.value, ast.Name)
        and n.value.id == "sys"
        for n in ast.walk(node)
    )


def _launches(tree: ast.AST) -> list[tuple[ast.Call, ast.AST]]:
    """Each call that starts a Python child, with the function (or module) it is in."""
    found = []
    scopes: list[ast.AST] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen: set[int] = set()
    for scope in reversed(scopes):  # innermost functions first
        for node in ast.walk(scope):
            if id(node) in seen or not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in LAUNCHERS and node.args and _names_sys_executable(node.args[0]):
                seen.add(id(node))
                found.append((node, scope))
    return found


def _uses_child_env(scope: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and getattr(n.func, "id", None) == "child_env"
        for n in ast.walk(scope)
    )


def test_every_python_child_gets_child_env():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for call, scope in _launches(tree):
            has_env = any(k.arg == "env" for k in call.keywords)
            if not (has_env and _uses_child_env(scope)):
                offenders.append(f"{path.relative_to(TESTS)}:{call.lineno}")
    assert not offenders, f"a Python child without env=child_env(...): {offenders}"


def test_the_search_finds_the_children_it_checks():
    # The check above is only as good as its search: it finds the known launchers.
    found = {
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("*.py")
        if _launches(ast.parse(path.read_text()))
    }
    assert {
        "jit/test_cpython_internals.py",
        "test_property_budgets.py",
        "support/helpers.py",
        "distributed/test_two_processes.py",
    } <= found, found
