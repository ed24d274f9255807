"""The examples in the docstrings of treeclone.tree and treeclone.tree_util run and pass."""

from __future__ import annotations

import doctest
import inspect
import types

import pytest
import treeclone.tree
import treeclone.tree_util

MODULES = {"tree": treeclone.tree, "tree_util": treeclone.tree_util}

# The tree_util functions added with treeclone.tree, each of which has an example.
TREE_UTIL_WITH_EXAMPLES = ("tree_broadcast", "tree_reduce", "tree_reduce_associative")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_doctests_pass(name: str) -> None:
    module = MODULES[name]
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0, f"{result.failed} failing example(s) in {module.__name__}"
    assert result.attempted >= 1, f"no example was run in {module.__name__}"


def _public_functions(module: types.ModuleType) -> list[str]:
    return [
        name
        for name in dir(module)
        if not name.startswith("_") and inspect.isfunction(getattr(module, name))
    ]


@pytest.mark.parametrize("name", _public_functions(treeclone.tree))
def test_every_tree_function_has_an_example(name: str) -> None:
    assert ">>> " in (getattr(treeclone.tree, name).__doc__ or "")


@pytest.mark.parametrize("name", TREE_UTIL_WITH_EXAMPLES)
def test_new_tree_util_functions_have_an_example(name: str) -> None:
    function = getattr(treeclone.tree_util, name)
    assert function.__module__ == "treeclone.tree_util"
    assert ">>> " in (function.__doc__ or "")
