"""``alias`` equals plain Python on every container kind JAX knows, detaching included.

Random trees mix dict, OrderedDict, defaultdict, a registered dict subclass, list, a registered
list subclass, tuples, a dataclass registered with a ``drop_fields`` field and a registered
class with an attribute its flatten leaves out. Random programs set, add, delete, append, pop,
detach (mutate a child container, then put a fresh one in its place) and re-attach (move a
container elsewhere). Plain Python runs the program on a deep copy, seeing dicts sorted as the
function does (``run_as_alias``: rule J8); under ``alias``, jitted and eager, every one of the
caller's original containers (those still in the tree and those the program detached) must
end equal to its plain-Python twin: same type, same items in the same order, same leaves,
same attributes, including the state outside the pytree.
"""

from __future__ import annotations

import copy

import treeclone as tc
from hypothesis import HealthCheck, given, settings
from mutation_programs import (
    Model,
    Noted,
    containers,
    describe,
    programs,
    run_as_alias,
    run_program,
    trees,
)

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trees, programs)
def test_alias_equals_plain_python_on_every_container_kind(tree, program):
    for node in containers(tree):
        if isinstance(node, Model):
            node.history.append("caller's history")
        if isinstance(node, Noted):
            node.note = "caller's note"
    expected = copy.deepcopy(tree)
    expected_nodes = containers(expected)
    expected_index = {id(n): i for i, n in enumerate(expected_nodes)}
    run_as_alias(expected, program)

    def f(t):
        run_program(t, program)

    for runner in (
        lambda t: tc.jit(f, policy="alias")(t),
        lambda t: tc.call(f, t, policy="alias"),
    ):
        mine = copy.deepcopy(tree)
        mine_nodes = containers(mine)  # the caller's objects, detached ones included
        runner(mine)
        mine_index = {id(n): i for i, n in enumerate(mine_nodes)}
        for got, want in zip(mine_nodes, expected_nodes, strict=True):
            got, want = describe(got, mine_index), describe(want, expected_index)
            assert got == want, (program, got, want)
