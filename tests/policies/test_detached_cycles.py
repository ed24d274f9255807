"""A step that takes a container out of its arguments and makes it contain itself (issue 57):
``x = state["a"]; del state["a"]; x.append(x)``. Plain Python and jax.jit run it, and so does
clone. Under alias what a function does to a container it detached is written back into the
caller's container (rule J20), but one that contains itself is not a pytree and cannot be: the
call is a ``ValueError`` naming the caller's key path (``state['a']``), nothing written; under
strict the change is not returned, a ``MutationError`` naming it. Both named the internal tree
the trace flattens after the call (``[2][0]``) before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeclone as tc


def _detach_and_loop(state: dict) -> jax.Array:
    x = state["a"]
    del state["a"]
    x.append(x)
    return state["b"] * 2


def _nested(state: dict) -> jax.Array:  # deeper: a dict detached, a cycle through a list
    x = state["inner"]["cfg"]
    state["inner"]["cfg"] = {}
    x["loop"] = [x]
    return state["b"] + 1


CASES: dict[str, tuple[Callable[[dict], Any], Callable[[], dict], str]] = {
    "list": (_detach_and_loop, lambda: {"a": [jnp.ones(2)], "b": jnp.ones(3)}, r"state\['a'\]"),
    "dict": (
        _nested,
        lambda: {"inner": {"cfg": {"w": jnp.ones(2)}}, "b": jnp.ones(3)},
        r"state\['inner'\]\['cfg'\]",
    ),
}

RUNS: dict[str, Callable[..., Any]] = {
    "jit": lambda f, policy, state: tc.jit(f, policy=policy)(state),
    "call": lambda f, policy, state: tc.call(f, state, policy=policy),
}


def _leaves(tree: Any) -> list:
    return [np.asarray(x).tolist() for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("case", list(CASES))
def test_clone_runs_it_as_jax_jit_does(case: str, run: str) -> None:
    f, make, _ = CASES[case]
    state, theirs = make(), make()
    np.testing.assert_array_equal(RUNS[run](f, "clone", state), jax.jit(f)(theirs))
    assert _leaves(state) == _leaves(make())  # the caller's state is left as it was


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("case", list(CASES))
def test_alias_names_the_detached_container_and_writes_nothing(case: str, run: str) -> None:
    f, make, where = CASES[case]
    state = make()
    keys = list(state)
    with pytest.raises(ValueError, match=rf"the \w+ at {where} out of its arguments") as info:
        RUNS[run](f, "alias", state)
    assert "[2]" not in str(info.value)  # no internal key path
    assert list(state) == keys and _leaves(state) == _leaves(make())


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("case", list(CASES))
def test_strict_names_the_unreturned_change(case: str, run: str) -> None:
    f, make, where = CASES[case]
    state = make()
    with pytest.raises(tc.MutationError, match=rf"{where}: detached from the arguments") as info:
        RUNS[run](f, "strict", state)
    assert "[2]" not in str(info.value)
    assert _leaves(state) == _leaves(make())


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_a_cycle_left_in_an_argument_or_the_result_names_it(policy: str) -> None:
    def into_argument(state: dict) -> jax.Array:
        state["inner"]["up"] = state
        return state["b"]

    def into_result(state: dict) -> list:
        loop: list = [state["b"]]
        loop.append(loop)
        return loop

    with pytest.raises(ValueError, match=r"the dict at state contains itself") as info:
        tc.jit(into_argument, policy=policy)({"inner": {}, "b": jnp.ones(2)})
    assert "[0]" not in str(info.value).split("relative")[0]
    with pytest.raises(ValueError, match=r"the list at the result contains itself"):
        tc.jit(into_result, policy=policy)({"b": jnp.ones(2)})
