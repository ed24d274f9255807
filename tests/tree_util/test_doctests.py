"""The examples in the docstrings of treeclone's public modules run and pass, and every public
function of treeclone.tree, treeclone.jit, treeclone.jit_partial, treeclone.policies and of
the lifted transformations (treeclone.grad, treeclone.checkpoint, treeclone.vmap,
treeclone.shard_map, treeclone.loops, treeclone.cond: a package's face, the module that
defines its functions) and of the call machinery they share (the modules of treeclone._lift),
and every public method of their classes, has one."""

from __future__ import annotations

import doctest
import importlib
import inspect
import types
from typing import Any

import pytest
import treeclone

# Module names as imported: treeclone.jit and treeclone.call are also the names of functions.
MODULES = {
    name: importlib.import_module(name)
    for name in (
        "treeclone",
        "treeclone._docs",
        "treeclone._lift.arguments",
        "treeclone._lift.boxes",
        "treeclone._lift.kept",
        "treeclone._lift.naming",
        "treeclone._lift.runner",
        "treeclone._lift.wrapper",
        "treeclone._policy_keys",
        "treeclone.call",
        "treeclone.cond.branches",
        "treeclone.jaxlib_tree_util",
        "treeclone._jit.jitted",
        "treeclone.loops.loop",
        "treeclone._jit.partial",
        "treeclone.policies",
        "treeclone.tree",
        "treeclone.tree_util",
        "treeclone.grad.gradients",
        "treeclone.checkpoint",
        "treeclone.vmap.batched",
        "treeclone.shard_map",
    )
}

# Modules whose every public function and method must have an example.
WITH_EXAMPLES = (
    "treeclone._lift.arguments",
    "treeclone._lift.boxes",
    "treeclone._lift.kept",
    "treeclone._lift.naming",
    "treeclone._lift.runner",
    "treeclone.call",
    "treeclone.cond.branches",
    "treeclone._jit.jitted",
    "treeclone.loops.loop",
    "treeclone._jit.partial",
    "treeclone.policies",
    "treeclone.tree",
    "treeclone.grad.gradients",
    "treeclone.checkpoint",
    "treeclone.vmap.batched",
    "treeclone.shard_map",
)


def test_rust_doctests_pass() -> None:
    """The examples in the Rust core's docstrings (tree_flatten, tree_map, PyTreeDef, ...),
    which doctest.testmod of the modules re-exporting them does not collect."""
    from treeclone import _native

    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    tests = [
        test
        for name, obj in vars(_native).items()
        if callable(obj) and not name.startswith("__")
        for test in finder.find(obj, name)
        if test.examples
    ]
    assert len(tests) >= 5
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


@pytest.mark.parametrize("name", sorted(MODULES))
def test_doctests_pass(name: str) -> None:
    module = MODULES[name]
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0, f"{result.failed} failing example(s) in {module.__name__}"
    assert result.attempted >= 1, f"no example was run in {module.__name__}"


def _defined_in(value: Any, module: types.ModuleType) -> bool:
    return getattr(value, "__module__", None) in (module.__name__, "treeclone._native")


def _public_functions(module: types.ModuleType) -> list[str]:
    """The public functions (Python or native) defined by ``module``, and the public methods and
    properties of the classes it defines, as ``name`` or ``Class.name``."""
    found = []
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or not _defined_in(value, module):
            continue
        if inspect.isroutine(value):
            found.append(name)
        elif inspect.isclass(value) and value.__module__ == module.__name__:
            for attribute, member in vars(value).items():
                if attribute.startswith("_") and attribute not in ("_cache_size",):
                    continue
                if inspect.isroutine(member) or isinstance(member, property):
                    found.append(f"{name}.{attribute}")
    return found


def _doc(module: types.ModuleType, qualname: str) -> str:
    value: Any = module
    for part in qualname.split("."):
        value = (
            inspect.getattr_static(value, part) if inspect.isclass(value) else getattr(value, part)
        )
    return inspect.getdoc(value) or ""


FUNCTIONS = [
    pytest.param(module, name, id=f"{module}.{name}")
    for module in WITH_EXAMPLES
    for name in _public_functions(MODULES[module])
]


@pytest.mark.parametrize(("module", "name"), FUNCTIONS)
def test_every_public_function_has_an_example(module: str, name: str) -> None:
    assert ">>> " in _doc(MODULES[module], name)


def test_the_listed_functions_are_found() -> None:
    names = {(module, name) for module, name in (p.values for p in FUNCTIONS)}
    for expected in [
        ("treeclone._jit.jitted", "jit"),
        ("treeclone._lift.naming", "argument_names"),
        ("treeclone._lift.naming", "Naming.name"),
        ("treeclone._jit.jitted", "Jitted._cache_size"),
        ("treeclone._jit.jitted", "Jitted.lower"),
        ("treeclone.policies", "policy"),
        ("treeclone.policies", "Policy.name"),
        ("treeclone.tree", "map"),
        ("treeclone.call", "call"),
        ("treeclone.grad.gradients", "grad"),
        ("treeclone.grad.gradients", "value_and_grad"),
        ("treeclone.checkpoint", "checkpoint"),
        ("treeclone.vmap.batched", "vmap"),
        ("treeclone.shard_map", "shard_map"),
        ("treeclone.loops.loop", "scan"),
        ("treeclone.loops.loop", "fori_loop"),
        ("treeclone.loops.loop", "while_loop"),
    ]:
        assert expected in names


@pytest.mark.parametrize("name", _public_functions(MODULES["treeclone.tree_util"]))
def test_tree_util_functions_have_an_example(name: str) -> None:
    assert ">>> " in _doc(MODULES["treeclone.tree_util"], name)


@pytest.mark.parametrize(
    "name",
    [name for name in treeclone.__all__ if name != "__version__"],
)
def test_top_level_names_are_documented(name: str) -> None:
    assert inspect.getdoc(getattr(treeclone, name))
