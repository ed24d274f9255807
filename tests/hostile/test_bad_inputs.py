"""Bad inputs. Every check runs in a process of its own (``helpers.run_warm``) so that a crash
(segfault, abort, stack overflow) fails the test instead of killing pytest. Each script prints a
marker on success.

Where JAX gives a clear Python exception, treeclone must raise the same exception type.
"""

from __future__ import annotations

import pytest
from helpers import run_warm

# Shared by several scripts: entry points run the same way on either module.
ENTRY_POINTS = """
import numpy as np
from helpers import capture, check_same_error
import trees

ENTRY_POINTS = {
    "tree_flatten": lambda m, t, **kw: m.tree_flatten(t, **kw),
    "tree_leaves": lambda m, t, **kw: m.tree_leaves(t, **kw),
    "tree_structure": lambda m, t, **kw: m.tree_structure(t, **kw),
    "tree_map": lambda m, t, **kw: m.tree_map(lambda x: x, t, **kw),
    "tree_flatten_with_path": lambda m, t, **kw: m.tree_flatten_with_path(t, **kw),
    "tree_leaves_with_path": lambda m, t, **kw: m.tree_leaves_with_path(t, **kw),
    "tree_map_with_path": lambda m, t, **kw: m.tree_map_with_path(lambda p, x: x, t, **kw),
    "tree_reduce": lambda m, t, **kw: m.tree_reduce(lambda a, x: a, t, 0, **kw),
}
"""


# --------------------------------------------------------------------------------------------
# cycles
# --------------------------------------------------------------------------------------------

CYCLES = {
    "list_self": "a = [1]; a.append(a); tree = a",
    "dict_self": "d = {'x': 1}; d['self'] = d; tree = d",
    "tuple_via_list": "l = [1]; t = (l,); l.append(t); tree = t",
    "namedtuple_via_list": "l = []; p = trees.Point(l, 2); l.append(p); tree = p",
    "ordered_dict_self": (
        "import collections; d = collections.OrderedDict(b=1); d['a'] = d; tree = d"
    ),
    "defaultdict_self": (
        "import collections; d = collections.defaultdict(list); d['a'] = d; tree = d"
    ),
    "long_list_cycle": (
        "first = [0]; cur = first\n"
        "for i in range(50):\n"
        "    nxt = [i]; cur.append(nxt); cur = nxt\n"
        "cur.append(first); tree = {'root': first}"
    ),
    "custom_jax_registered_self": "p = trees.PairJ(1, None); p.b = p; tree = p",
    "custom_tc_registered_via_list": "p = trees.PairT(1, []); p.b.append(p); tree = [p]",
    "dataclass_via_list": "d = trees.DataT(1, None); d.b = [d]; tree = d",
    "keyed_class_self": "k = trees.KeyBagT([1]); k.items.append(k); tree = k",
    "late_registered_self": "p = trees.LatePairJ(1, None); p.a = p; tree = (p,)",
}


@pytest.mark.parametrize("kind", sorted(CYCLES))
def test_cycle_raises_value_error_mentioning_cycle(kind):
    run_warm(
        ENTRY_POINTS
        + CYCLES[kind]
        + """
for name, call in ENTRY_POINTS.items():
    exc = capture(lambda: call(tc, tree))
    assert exc is not None, f"{name}: no error for a cyclic tree"
    assert type(exc) is ValueError, f"{name}: expected ValueError, got {exc!r}"
    assert "cycle" in str(exc).lower(), f"{name}: message does not mention a cycle: {exc}"
# the library still works afterwards
assert tc.tree_leaves([1, (2, {"a": 3})]) == [1, 2, 3]
"""
    )


def test_cycle_below_a_leaf_is_not_an_error():
    run_warm(
        ENTRY_POINTS
        + """
a = [1]
a.append(a)
tree = {"c": a, "d": [a, 2]}
is_leaf = lambda x: x is a
leaves, td = tc.tree_flatten(tree, is_leaf=is_leaf)
assert len(leaves) == 3 and leaves[0] is a and leaves[1] is a and leaves[2] == 2
assert td.to_jax() == jtu.tree_structure(tree, is_leaf=is_leaf)
mapped = tc.tree_map(lambda x: x, tree, is_leaf=is_leaf)
assert mapped["c"] is a and mapped["d"][0] is a
# a cyclic object as a plain leaf of an unregistered type
class Holder:
    pass
h = Holder(); h.me = h
assert tc.tree_leaves([h, h])[1] is h
"""
    )


def test_shared_subtrees_are_not_cycles():
    run_warm(
        """
x = [1, 2]
tree = [x, x, {"a": x, "b": (x, [x])}]
assert tc.tree_leaves(tree) == jtu.tree_leaves(tree)
t = [0]
for _ in range(16):
    t = [t, t]  # 65536 leaves through a DAG of 17 distinct lists
assert len(tc.tree_leaves(t)) == 2**16
assert tc.tree_structure(t).to_jax() == jtu.tree_structure(t)
"""
    )


# --------------------------------------------------------------------------------------------
# very deep nesting: works (and round-trips) or raises RecursionError; never crashes
# --------------------------------------------------------------------------------------------

DEEP_KINDS = {
    # name: (wrap expression building one level around `t`, expression unwrapping `x`)
    "list": ("[t]", "x[0]"),
    "tuple": ("(t,)", "x[0]"),
    "dict": ("{'k': t}", "x['k']"),
    "ordered_dict": ("collections.OrderedDict(k=t)", "x['k']"),
    "namedtuple": ("trees.Point(t, None)", "x.x"),
    "tc_registered_class": ("trees.BagT([t])", "x.items[0]"),
    "jax_registered_keyed_class": ("trees.KeyBagJ([t])", "x.items[0]"),
    "tc_registered_dataclass": ("trees.DataT(t, None)", "x.w"),
}


@pytest.mark.parametrize("kind", sorted(DEEP_KINDS))
def test_100k_deep_nesting_works_or_raises_recursion_error(kind):
    wrap, unwrap = DEEP_KINDS[kind]
    run_warm(
        f"""
import collections, gc, pickle
import trees
DEPTH = 100_000
SENTINEL = trees.Opaque("bottom")

def build():
    t = SENTINEL
    for _ in range(DEPTH):
        t = {wrap}
    return t

def check_rebuilt(x):
    for _ in range(DEPTH):
        assert type(x) is type(tree), type(x)
        x = {unwrap}
    assert x is SENTINEL

def attempt(name, fn):
    try:
        return fn()
    except RecursionError:
        print(name, "-> RecursionError")
        return None

tree = build()
result = attempt("tree_flatten", lambda: tc.tree_flatten(tree))
if result is not None:
    leaves, td = result
    assert len(leaves) == 1 and leaves[0] is SENTINEL, leaves[:3]
    assert td.num_leaves == 1
    rebuilt = attempt("unflatten", lambda: tc.tree_unflatten(td, [SENTINEL]))
    if rebuilt is not None:
        check_rebuilt(rebuilt)
        del rebuilt
    attempt("repr", lambda: repr(td))
    attempt("hash", lambda: hash(td))
    other = attempt("tree_structure", lambda: tc.tree_structure(build()))
    if other is not None:
        eq = attempt("eq", lambda: td == other)
        assert eq in (True, None)
        del other
    restored = attempt("pickle", lambda: pickle.loads(pickle.dumps(td)))
    if restored is not None:
        assert attempt("eq-restored", lambda: restored == td) in (True, None)
        del restored
    attempt("children", lambda: td.children())
    attempt("node_data", lambda: td.node_data())
    attempt("to_jax", lambda: td.to_jax())
    attempt("flatten_up_to", lambda: td.flatten_up_to(tree))
    del td
mapped = attempt("tree_map", lambda: tc.tree_map(lambda x: x, tree))
if mapped is not None:
    check_rebuilt(mapped)
    del mapped
leaves = attempt("tree_leaves", lambda: tc.tree_leaves(tree))
assert leaves is None or (len(leaves) == 1 and leaves[0] is SENTINEL)
pairs = attempt("tree_flatten_with_path", lambda: tc.tree_flatten_with_path(tree))
if pairs is not None:
    assert len(pairs[0]) == 1 and len(pairs[0][0][0]) == DEPTH and pairs[0][0][1] is SENTINEL
    del pairs
gc.collect()
assert tc.tree_leaves([1, [2]]) == [1, 2]
""",
        timeout=600,
    )


def test_branches_at_the_exact_depth_threshold_flatten_and_their_cycles_are_caught():
    """Many small branches at the bottom of a spine as deep as the guard's exact-depth
    threshold (10,000): each branch was a rebuild of the path's set (issue 57's cliff, fixed in
    rust/traverse/guard.rs, whose tests count the work). What must not change with it: the
    leaves in order, and a cycle through a branch, or through fresh objects past the
    threshold, still an error."""
    run_warm(
        """
import collections

def spine(depth, branches):
    root = []
    cur = root
    for _ in range(depth - 1):
        nxt = []
        cur.append(nxt)
        cur = nxt
    cur.extend([[i]] for i in range(branches))
    return root, cur

for depth in (9_997, 9_998, 9_999, 10_000, 10_001, 15_000):
    tree, bottom = spine(depth, 300)
    assert tc.tree_leaves(tree) == list(range(300)), depth
    assert tc.tree_leaves(tc.tree_map(lambda x: x, tree)) == list(range(300)), depth
    bottom[150][0].append(tree)  # a branch holding the root: a cycle at that depth
    try:
        tc.tree_leaves(tree)
    except ValueError as e:
        assert "cycle" in str(e).lower(), e
    else:
        raise AssertionError(f"no cycle error at depth {depth}")
    bottom[150][0].pop()
    bottom[299][0].append(bottom)  # and one through the bottom of the spine
    try:
        tc.tree_leaves(tree)
    except ValueError as e:
        assert "cycle" in str(e).lower(), e
    else:
        raise AssertionError(f"no cycle error at depth {depth}")
"""
    )


# --------------------------------------------------------------------------------------------
# misbehaving custom node functions
# --------------------------------------------------------------------------------------------

RAISING_NODES = """
class Boom(Exception):
    pass

def bad_flatten(x):
    raise Boom("flatten exploded")

def bad_flatten_with_keys(x):
    raise Boom("flatten_with_keys exploded")

def ok_flatten(x):
    return (x.v,), "aux"

def bad_unflatten(aux, children):
    raise Boom("unflatten exploded")

class FlattenJ:
    def __init__(self, v=1): self.v = v
class FlattenT:
    def __init__(self, v=1): self.v = v
class KeysJ:
    def __init__(self, v=1): self.v = v
class KeysT:
    def __init__(self, v=1): self.v = v
class UnflattenJ:
    def __init__(self, v=1): self.v = v
class UnflattenT:
    def __init__(self, v=1): self.v = v

jtu.register_pytree_node(FlattenJ, bad_flatten, bad_unflatten)
tc.register_pytree_node(FlattenT, bad_flatten, bad_unflatten)
jtu.register_pytree_with_keys(KeysJ, bad_flatten_with_keys, bad_unflatten, bad_flatten)
tc.register_pytree_with_keys(KeysT, bad_flatten_with_keys, bad_unflatten, bad_flatten)
jtu.register_pytree_node(UnflattenJ, ok_flatten, bad_unflatten)
tc.register_pytree_node(UnflattenT, ok_flatten, bad_unflatten)
"""


def test_raising_flatten_propagates_same_exception():
    run_warm(
        ENTRY_POINTS
        + RAISING_NODES
        + """
for cls in (FlattenJ, FlattenT, KeysJ, KeysT):
    for name, call in ENTRY_POINTS.items():
        tree = [0, {"x": cls()}]
        check_same_error(lambda: call(tc, tree), lambda: call(jtu, tree), f"{cls.__name__} {name}")
assert tc.tree_leaves([1, 2]) == [1, 2]
"""
    )


def test_raising_unflatten_propagates_same_exception():
    run_warm(
        RAISING_NODES
        + """
from helpers import check_same_error
for cls in (UnflattenJ, UnflattenT):
    tree = {"a": [cls(1), 2]}
    leaves, td = tc.tree_flatten(tree)
    jleaves, jtd = jtu.tree_flatten(tree)
    assert leaves == jleaves == [1, 2]
    checks = {
        "tree_unflatten": (lambda: tc.tree_unflatten(td, leaves), lambda: jtu.tree_unflatten(jtd, leaves)),
        "PyTreeDef.unflatten": (lambda: td.unflatten(leaves), lambda: jtd.unflatten(leaves)),
        "tree_map": (lambda: tc.tree_map(lambda x: x, tree), lambda: jtu.tree_map(lambda x: x, tree)),
        "tree_map_with_path": (
            lambda: tc.tree_map_with_path(lambda p, x: x, tree),
            lambda: jtu.tree_map_with_path(lambda p, x: x, tree),
        ),
    }
    for name, (tc_fn, jax_fn) in checks.items():
        check_same_error(tc_fn, jax_fn, f"{cls.__name__} {name}")
"""  # noqa: E501
    )


MALFORMED_FLATTEN = {
    "list_instead_of_tuple": "lambda c: [(c.v,), None]",
    "arity_1": "lambda c: ((c.v,),)",
    "arity_3": "lambda c: ((c.v,), None, 3)",
    "returns_none": "lambda c: None",
    "returns_int": "lambda c: 7",
    "children_none": "lambda c: (None, 'aux')",
    "children_int": "lambda c: (5, 'aux')",
    "children_object": "lambda c: (object(), 'aux')",
    # iterable children are accepted by JAX; treeclone must give the same result
    "children_generator": "lambda c: ((y for y in [c.v, 2]), 'aux')",
    "children_list": "lambda c: ([c.v, 2], 'aux')",
    "children_dict_iterates_keys": "lambda c: ({'k': c.v}, 'aux')",
    "children_string": "lambda c: ('ab', 'aux')",
    "children_iterator_raises": "lambda c: ((1 // 0 for y in [c.v]), 'aux')",
}


@pytest.mark.parametrize("variant", sorted(MALFORMED_FLATTEN))
def test_malformed_flatten_result_matches_jax(variant):
    run_warm(
        f"""
import trees
from helpers import capture
for registrar in (jtu, tc):
    class Node:
        def __init__(self, v=1, *rest):
            self.v = v
    registrar.register_pytree_node(
        Node, {MALFORMED_FLATTEN[variant]}, lambda a, ch, Node=Node: Node(*ch)
    )
    calls = {{
        "tree_flatten": lambda m: m.tree_flatten([0, Node()]),
        "tree_structure": lambda m: m.tree_structure([0, Node()]),
        "tree_flatten_with_path": lambda m: m.tree_flatten_with_path([0, Node()]),
        "tree_map": lambda m: m.tree_leaves(m.tree_map(lambda x: x, [0, Node()])),
    }}
    for name, call in calls.items():
        where = f"{{name}} (registered via {{registrar.__name__}})"
        jax_exc = capture(lambda: call(jtu))
        tc_exc = capture(lambda: call(tc))
        if jax_exc is None:
            assert tc_exc is None, f"{{where}}: treeclone raised {{tc_exc!r}}, JAX succeeded"
            jres, tres = call(jtu), call(tc)
            if name == "tree_flatten":
                assert tres[0] == jres[0] and tres[1].to_jax() == jres[1], (where, tres, jres)
            elif name == "tree_structure":
                assert tres.to_jax() == jres, where
            elif name == "tree_flatten_with_path":
                assert tres[0] == jres[0], (where, tres[0], jres[0])
            else:
                assert tres == jres, (where, tres, jres)
        else:
            assert tc_exc is not None, f"{{where}}: JAX raised {{jax_exc!r}}, treeclone did not"
            assert type(tc_exc) is type(jax_exc), (
                f"{{where}}: treeclone raised {{tc_exc!r}}, JAX raised {{jax_exc!r}}"
            )
assert tc.tree_leaves([1, 2]) == [1, 2]
"""
    )


MALFORMED_KEYS = {
    "children_not_pairs": "lambda c: ((c.v,), None)",
    "pair_of_three": "lambda c: (((jtu.GetAttrKey('v'), c.v, 3),), None)",
    "children_int": "lambda c: (5, None)",
    "returns_none": "lambda c: None",
    "arity_3": "lambda c: (((jtu.GetAttrKey('v'), c.v),), None, 1)",
}


@pytest.mark.parametrize("variant", sorted(MALFORMED_KEYS))
def test_malformed_flatten_with_keys_raises_type_or_value_error(variant):
    run_warm(
        f"""
from helpers import capture
for registrar in (jtu, tc):
    class Node:
        def __init__(self, v=1, *rest):
            self.v = v
    registrar.register_pytree_with_keys(
        Node, {MALFORMED_KEYS[variant]}, lambda a, ch, Node=Node: Node(*ch)
    )
    calls = {{
        "tree_flatten_with_path": lambda m: m.tree_flatten_with_path([Node()]),
        "tree_leaves_with_path": lambda m: m.tree_leaves_with_path([Node()]),
        "tree_map_with_path": lambda m: m.tree_map_with_path(lambda p, x: x, [Node()]),
    }}
    for name, call in calls.items():
        where = f"{{name}} (registered via {{registrar.__name__}})"
        jax_exc = capture(lambda: call(jtu))
        assert isinstance(jax_exc, (TypeError, ValueError)), (where, jax_exc)
        tc_exc = capture(lambda: call(tc))
        assert isinstance(tc_exc, (TypeError, ValueError)), f"{{where}}: {{tc_exc!r}}"
    exc = capture(lambda: tc.tree_flatten([Node()]))
    assert exc is None or isinstance(exc, (TypeError, ValueError)), repr(exc)
"""
    )


# --------------------------------------------------------------------------------------------
# unflatten with the wrong leaves
# --------------------------------------------------------------------------------------------


def test_unflatten_wrong_number_of_leaves():
    run_warm(
        """
import trees
from helpers import capture
tree = {"a": trees.PairT(1, [2, 3]), "b": (None, trees.DataJ(4, 5))}
td = tc.tree_structure(tree)
assert td.num_leaves == 5
jax_td = jtu.tree_structure(tree)
for n in (0, 1, 4, 6, 50):
    expected = capture(lambda: jax_td.unflatten(list(range(n))))
    for fn in (lambda: td.unflatten(list(range(n))), lambda: tc.tree_unflatten(td, range(n))):
        exc = capture(fn)
        assert type(exc) is ValueError, f"{n} leaves: {exc!r}"
        # jaxlib's text: it names the count given only when it is too small
        assert str(exc) == str(expected), f"{n} leaves: {str(exc)!r} != {str(expected)!r}"
for small, leaves in (([None, {}, ()], [1]), (1, [])):
    exc = capture(lambda: tc.tree_structure(small).unflatten(leaves))
    expected = capture(lambda: jtu.tree_structure(small).unflatten(leaves))
    assert type(exc) is ValueError and str(exc) == str(expected), (exc, expected)
"""
    )


def test_unflatten_non_iterable_or_raising_leaves():
    run_warm(
        """
from helpers import capture, check_same_error
tree = [1, {"a": 2}]
td, jtd = tc.tree_structure(tree), jtu.tree_structure(tree)
for bad in (5, None, 3.5, object()):
    jax_exc = capture(lambda: jtd.unflatten(bad))
    tc_exc = capture(lambda: td.unflatten(bad))
    assert type(tc_exc) is type(jax_exc) is TypeError, (bad, tc_exc, jax_exc)
    tc_exc = capture(lambda: tc.tree_unflatten(td, bad))
    assert type(tc_exc) is TypeError, (bad, tc_exc)

class Boom(Exception):
    pass

def leaves_then_boom():
    yield 1
    raise Boom("leaf iterator exploded")

check_same_error(
    lambda: td.unflatten(leaves_then_boom()), lambda: jtd.unflatten(leaves_then_boom())
)
check_same_error(
    lambda: tc.tree_unflatten(td, leaves_then_boom()),
    lambda: jtu.tree_unflatten(jtd, leaves_then_boom()),
)
assert td.unflatten([7, 8]) == [7, {"a": 8}]
"""
    )


# --------------------------------------------------------------------------------------------
# is_leaf and mapped functions that raise or misbehave
# --------------------------------------------------------------------------------------------


def test_raising_is_leaf_propagates_same_exception():
    run_warm(
        ENTRY_POINTS
        + """
class Boom(Exception):
    pass

def make_pred(calls, takes_path=False):
    def pred(*args):
        calls.append(args[-1])
        if len(calls) == 4:
            raise Boom("is_leaf exploded")
        return False
    return pred

tree = {"a": [1, (2, None)], "b": trees.PairT(3, [4]), "c": trees.DataJ(5, 6)}
for name, call in ENTRY_POINTS.items():
    tc_calls, jax_calls = [], []
    check_same_error(
        lambda: call(tc, tree, is_leaf=make_pred(tc_calls)),
        lambda: call(jtu, tree, is_leaf=make_pred(jax_calls)),
        name,
    )
    assert len(tc_calls) == len(jax_calls) == 4, (name, len(tc_calls), len(jax_calls))
    assert all(a is b for a, b in zip(tc_calls, jax_calls)), name
for name in ("tree_flatten_with_path", "tree_leaves_with_path", "tree_map_with_path"):
    tc_calls, jax_calls = [], []
    check_same_error(
        lambda: ENTRY_POINTS[name](tc, tree, is_leaf=make_pred(tc_calls), is_leaf_takes_path=True),
        lambda: ENTRY_POINTS[name](jtu, tree, is_leaf=make_pred(jax_calls), is_leaf_takes_path=True),
        name + " (takes_path)",
    )
    assert len(tc_calls) == len(jax_calls) == 4
"""  # noqa: E501
    )


@pytest.mark.parametrize(
    "value", ["0", "1", "np.bool_(True)", "np.array(True)", "'yes'", "None", "[]"]
)
def test_is_leaf_non_boolean_result_matches_jax(value):
    run_warm(
        ENTRY_POINTS
        + f"""
for name, call in ENTRY_POINTS.items():
    tree = [1, [2, (3,)]]
    jax_exc = capture(lambda: call(jtu, tree, is_leaf=lambda x: {value}))
    tc_exc = capture(lambda: call(tc, tree, is_leaf=lambda x: {value}))
    assert type(tc_exc) is type(jax_exc), f"{{name}}: treeclone {{tc_exc!r}}, JAX {{jax_exc!r}}"
    if jax_exc is None:
        assert repr(call(tc, tree, is_leaf=lambda x: {value})) == repr(
            call(jtu, tree, is_leaf=lambda x: {value})
        ), name
"""
    )


def test_mapped_function_raising_midway_propagates():
    run_warm(
        """
from helpers import capture, check_same_error
import trees

class Boom(Exception):
    pass

def make_fn(calls):
    def fn(*args):
        calls.append(args)
        if len(calls) == 3:
            raise Boom("f exploded on the third leaf")
        return args[-1]
    return fn

tree = {"a": [1, 2], "b": trees.PairT(3, 4), "c": (5, trees.KeyBagJ([6]))}
other = jtu.tree_map(lambda x: -x, tree)
for m_name, run in {
    "tree_map": lambda m, f: m.tree_map(f, tree),
    "tree_map_two": lambda m, f: m.tree_map(f, tree, other),
    "tree_map_with_path": lambda m, f: m.tree_map_with_path(f, tree),
    "tree_reduce": lambda m, f: m.tree_reduce(f, tree),
    "tree_reduce_init": lambda m, f: m.tree_reduce(f, tree, 0),
}.items():
    tc_calls, jax_calls = [], []
    check_same_error(lambda: run(tc, make_fn(tc_calls)), lambda: run(jtu, make_fn(jax_calls)), m_name)
    assert tc_calls == jax_calls, (m_name, tc_calls, jax_calls)
assert tc.tree_map(lambda x: x * 10, tree)["a"] == [10, 20]
check_same_error(lambda: tc.tree_map(5, [1]), lambda: jtu.tree_map(5, [1]), "non-callable")
assert tc.tree_map(5, []) == jtu.tree_map(5, []) == []
check_same_error(
    lambda: tc.tree_map(lambda x: x, [1], [2]),
    lambda: jtu.tree_map(lambda x: x, [1], [2]),
    "wrong arity",
)
"""  # noqa: E501
    )


# --------------------------------------------------------------------------------------------
# dict keys
# --------------------------------------------------------------------------------------------

UNSORTABLE = {
    "int_and_str": "{1: 1, 'a': 2}",
    "none_and_int": "{None: 1, 2: 2}",
    "nested_deep": "[0, ({'x': {3: 'c', 'b': 4}},)]",
    "raising_lt": "{RaisingLt(): 1, RaisingLt(): 2}",
    "int_and_str_in_custom_node": "trees.PairT({1: 1, 'a': 2}, 0)",
    "defaultdict_int_and_str": "collections.defaultdict(list, {1: 1, 'a': 2})",
    # these need no comparisons, JAX accepts them
    "ordered_dict_int_and_str": "collections.OrderedDict({1: 1, 'a': 2})",
    "single_unorderable_key": "{RaisingLt(): 1}",
}


@pytest.mark.parametrize("kind", sorted(UNSORTABLE))
def test_unsortable_dict_keys_match_jax(kind):
    run_warm(
        ENTRY_POINTS
        + f"""
import collections

class RaisingLt:
    def __lt__(self, other):
        raise KeyError("no ordering")
    __gt__ = __le__ = __ge__ = __lt__
    def __hash__(self):
        return id(self)
    def __repr__(self):
        return "RaisingLt()"

tree = {UNSORTABLE[kind]}
for name, call in ENTRY_POINTS.items():
    jax_exc = capture(lambda: call(jtu, tree))
    tc_exc = capture(lambda: call(tc, tree))
    assert type(tc_exc) is type(jax_exc), f"{{name}}: treeclone {{tc_exc!r}}, JAX {{jax_exc!r}}"
    if jax_exc is None:
        assert repr(call(tc, tree)) == repr(call(jtu, tree)), name
"""
    )


# --------------------------------------------------------------------------------------------
# troublesome aux data
# --------------------------------------------------------------------------------------------

AUX_NODE = """
import numpy as np
from helpers import capture

class AuxNode:
    def __init__(self, aux, v=1):
        self.aux = aux
        self.v = v

jtu.register_pytree_node(AuxNode, lambda n: ((n.v,), n.aux), lambda aux, ch: AuxNode(aux, *ch))

class BadEq:
    def __eq__(self, other):
        raise RuntimeError("aux __eq__ exploded")
    def __hash__(self):
        return 1

class ArrayEq:
    def __eq__(self, other):
        return np.array([True, False])
    def __hash__(self):
        return 2

class BadHash:
    def __eq__(self, other):
        return isinstance(other, BadHash)
    def __hash__(self):
        raise RuntimeError("aux __hash__ exploded")

class BadRepr:
    def __repr__(self):
        raise RuntimeError("aux __repr__ exploded")
    def __eq__(self, other):
        return isinstance(other, BadRepr)
    def __hash__(self):
        return 3

def compare(make_aux, what):
    a, b = AuxNode(make_aux()), AuxNode(make_aux())
    tda, tdb = tc.tree_structure([a]), tc.tree_structure([b])
    jda, jdb = jtu.tree_structure([a]), jtu.tree_structure([b])
    jax_exc = capture(lambda: jda == jdb)
    tc_exc = capture(lambda: tda == tdb)
    if jax_exc is None:
        assert tc_exc is None, f"{what}: == raised {tc_exc!r}"
        assert (tda == tdb) == (jda == jdb), what
    else:
        assert tc_exc is not None, f"{what}: JAX raised {jax_exc!r}, treeclone did not"
        assert type(tc_exc) is type(jax_exc), f"{what}: == raised {tc_exc!r}, JAX {jax_exc!r}"
    # hashing: an int, or a clear Python exception
    for td in (tda, tdb):
        exc = capture(lambda: hash(td))
        assert exc is None or (isinstance(exc, Exception) and not isinstance(exc, SystemError)), (
            f"{what}: hash raised {exc!r}"
        )
    # rest-tree comparison in tree_map also compares aux data
    jax_exc = capture(lambda: jtu.tree_map(lambda x, y: x, [a], [b]))
    tc_exc = capture(lambda: tc.tree_map(lambda x, y: x, [a], [b]))
    assert type(tc_exc) is type(jax_exc), f"{what}: tree_map raised {tc_exc!r}, JAX {jax_exc!r}"
    # repr
    jax_exc = capture(lambda: repr(jda))
    tc_exc = capture(lambda: repr(tda))
    assert type(tc_exc) is type(jax_exc), f"{what}: repr raised {tc_exc!r}, JAX {jax_exc!r}"
    if jax_exc is None:
        assert repr(tda) == repr(jda)
"""


@pytest.mark.parametrize(
    "aux",
    ["[1, 2]", "{'k': [1]}", "BadEq()", "ArrayEq()", "np.arange(3)", "BadHash()", "BadRepr()"],
)
def test_troublesome_aux_data(aux):
    run_warm(AUX_NODE + f"\ncompare(lambda: {aux}, {aux!r})\n")


def test_treedef_with_unhashable_aux_in_a_set():
    run_warm(
        AUX_NODE
        + """
td = tc.tree_structure(AuxNode([1, 2]))
exc = capture(lambda: {td})
assert exc is None or isinstance(exc, TypeError), repr(exc)
if exc is None:
    assert td in {td}
"""
    )
