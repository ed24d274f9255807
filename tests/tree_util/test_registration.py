"""Registration: through treeclone (visible to JAX), through JAX (visible to treeclone, whether
registered before or after ``import treeclone``), argument validation, duplicates, threads."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu
import pytest
import treeclone.tree_util as tc
import trees
from helpers import (
    assert_same_objects,
    assert_same_outcome,
    assert_same_tree,
    drop_fields_arg,
    run_script,
)
from trees import Opaque, Rec

_counter = itertools.count()


def _fresh_name(base: str) -> str:
    return f"{base}{next(_counter)}"


# Each maker defines a brand-new class, registers it with ``registrar`` through one of the six
# registration functions, and returns an instance with two leaves (0 for register_static).


def _make_node(registrar: Any) -> Any:
    cls = type(_fresh_name("Node"), (trees._Pair,), {})
    registrar.register_pytree_node(cls, trees._pair_flatten, trees._pair_unflatten(cls))
    return cls(Opaque("a"), [Opaque("b")], meta="node")


def _make_node_with_keys_func(registrar: Any) -> Any:
    cls = type(_fresh_name("NodeK"), (trees._Pair,), {})
    registrar.register_pytree_node(
        cls, trees._pair_flatten, trees._pair_unflatten(cls), trees._pair_flatten_with_keys
    )
    return cls(Opaque("a"), {"z": Opaque("b")})


def _make_with_keys(registrar: Any) -> Any:
    cls = type(_fresh_name("WithKeys"), (trees._Pair,), {})
    registrar.register_pytree_with_keys(
        cls, trees._pair_flatten_with_keys, trees._pair_unflatten(cls)
    )
    return cls(Opaque("a"), (Opaque("b"),), meta="wk")


def _make_node_class(registrar: Any) -> Any:
    cls = type(_fresh_name("Bag"), (trees._Bag,), {})
    assert registrar.register_pytree_node_class(cls) is cls
    return cls([Opaque("a"), None, Opaque("b")])


def _make_with_keys_class(registrar: Any) -> Any:
    cls = type(_fresh_name("KeyBag"), (trees._Bag,), {})
    assert registrar.register_pytree_with_keys_class(cls) is cls
    return cls([Opaque("a"), [Opaque("b")]], name="kb")


def _make_dataclass(registrar: Any) -> Any:
    cls = dataclasses.make_dataclass(
        _fresh_name("Data"),
        [
            ("w", Any),
            ("b", Any),
            ("tag", str, dataclasses.field(default="t", metadata={"static": True})),
        ],
    )
    assert registrar.register_dataclass(cls) is cls
    return cls(Opaque("w"), {"k": Opaque("b")}, tag="meta")


def _make_dataclass_explicit(registrar: Any) -> Any:
    cls = dataclasses.make_dataclass(
        _fresh_name("DataX"), [("x", Any), ("y", Any), ("n", int), ("cache", int, 0)]
    )
    result = registrar.register_dataclass(
        cls, data_fields=["y", "x"], meta_fields=["n"], drop_fields=drop_fields_arg(["cache"])
    )
    assert result is cls
    return cls(Opaque("x"), Opaque("y"), 3, cache=7)


def _make_static(registrar: Any) -> Any:
    cls = type(_fresh_name("Static"), (trees._StaticVal,), {})
    assert registrar.register_static(cls) is cls
    return [cls("v"), Opaque("a")]


MAKERS: dict[str, Callable[[Any], Any]] = {
    "register_pytree_node": _make_node,
    "register_pytree_node+keys_func": _make_node_with_keys_func,
    "register_pytree_with_keys": _make_with_keys,
    "register_pytree_node_class": _make_node_class,
    "register_pytree_with_keys_class": _make_with_keys_class,
    "register_dataclass": _make_dataclass,
    "register_dataclass_explicit_fields": _make_dataclass_explicit,
    "register_static": _make_static,
}


def _assert_agree(obj: Any) -> None:
    """treeclone and JAX agree on everything about ``obj``; it is a node, not a leaf."""
    tc_leaves, tc_def = tc.tree_flatten(obj)
    jax_leaves, jax_def = jtu.tree_flatten(obj)
    assert jax_def.num_nodes > 1, "JAX does not see the type as a node"
    assert_same_objects(tc_leaves, jax_leaves)
    assert repr(tc_def) == repr(jax_def)
    assert tc_def.to_jax() == jax_def
    assert tc_def.node_data() == jax_def.node_data()
    tc_paths = tc.tree_flatten_with_path(obj)[0]
    jax_paths = jtu.tree_flatten_with_path(obj)[0]
    assert [p for p, _ in tc_paths] == [p for p, _ in jax_paths]
    assert_same_tree(tc.tree_unflatten(tc_def, tc_leaves), jtu.tree_unflatten(jax_def, jax_leaves))
    assert_same_tree(tc.tree_map(Rec, obj), jtu.tree_map(Rec, obj))
    assert_same_tree(tc.tree_map_with_path(Rec, obj), jtu.tree_map_with_path(Rec, obj))


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_registering_through_treeclone_registers_with_jax(kind):
    obj = MAKERS[kind](tc)
    assert jtu.tree_structure(obj).num_nodes > 1
    _assert_agree(obj)


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_registering_through_jax_after_import_is_honoured(kind):
    obj = MAKERS[kind](jtu)
    _assert_agree(obj)


@pytest.mark.parametrize("registrar", ["jtu", "tc"])
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_type_seen_as_leaf_then_registered(kind, registrar):
    """treeclone must not keep treating a type as a leaf after it is registered."""
    module = {"jtu": jtu, "tc": tc}[registrar]
    holder: dict[str, Any] = {}

    def defer(real: Any) -> Any:
        # Build the instance with registration postponed: run the maker against a recorder.
        class Recorder:
            def __getattr__(self, name: str) -> Callable[..., Any]:
                def record(cls: type, *args: Any, **kwargs: Any) -> type:
                    holder["call"] = (getattr(real, name), cls, args, kwargs)
                    return cls

                return record

        return Recorder()

    obj = MAKERS[kind](defer(module))
    func, cls, args, kwargs = holder["call"]
    instance = obj[0] if isinstance(obj, list) else obj
    assert tc.tree_leaves(instance) == [instance]
    assert tc.tree_structure(instance).num_nodes == 1
    assert tc.tree_leaves([instance, 1])[0] is instance
    func(cls, *args, **kwargs)
    _assert_agree(obj)
    assert tc.tree_structure(instance) == tc.PyTreeDef.from_jax(jtu.tree_structure(instance))


def test_module_level_jax_registrations_happened_before_treeclone_import():
    assert trees.TREECLONE_IMPORTED_BEFORE_JAX_REGISTRATIONS is False


def test_registered_with_jax_before_import_in_fresh_process():
    run_script(
        """
import dataclasses
from typing import Any
import jax.tree_util as jtu
import sys
assert "treeclone" not in sys.modules

class Node:
    def __init__(self, a, b): self.a, self.b = a, b
jtu.register_pytree_node(Node, lambda n: ((n.a, n.b), "aux"), lambda aux, ch: Node(*ch))

class Keyed:
    def __init__(self, a): self.a = a
jtu.register_pytree_with_keys(
    Keyed, lambda k: (((jtu.GetAttrKey("a"), k.a),), None), lambda aux, ch: Keyed(*ch)
)

@jtu.register_pytree_node_class
class Bag:
    def __init__(self, items): self.items = list(items)
    def tree_flatten(self): return self.items, len(self.items)
    @classmethod
    def tree_unflatten(cls, aux, ch): return cls(ch)

@jtu.register_pytree_with_keys_class
class KeyBag(Bag):
    def tree_flatten_with_keys(self):
        return [(jtu.SequenceKey(i), x) for i, x in enumerate(self.items)], len(self.items)

@jtu.register_dataclass
@dataclasses.dataclass
class Data:
    x: Any
    m: str = dataclasses.field(default="m", metadata={"static": True})

@jtu.register_static
class Static:
    def __hash__(self): return 0
    def __eq__(self, o): return isinstance(o, Static)

tree = {"n": Node(1, 2), "k": Keyed(3), "b": Bag([4]), "kb": KeyBag([5]), "d": Data(6),
        "s": Static()}

import treeclone.tree_util as tc

leaves, td = tc.tree_flatten(tree)
assert leaves == [4, 6, 3, 5, 1, 2], leaves
assert repr(td) == repr(jtu.tree_structure(tree)), repr(td)
assert td.to_jax() == jtu.tree_structure(tree)
assert [p for p, _ in tc.tree_flatten_with_path(tree)[0]] == [
    p for p, _ in jtu.tree_flatten_with_path(tree)[0]
]
rebuilt = tc.tree_unflatten(td, leaves)
assert jtu.tree_structure(rebuilt) == jtu.tree_structure(tree)
""",
        prelude=False,
    )


@pytest.mark.parametrize("first", ["jtu", "tc"])
@pytest.mark.parametrize("second", ["jtu", "tc"])
@pytest.mark.parametrize(
    "function",
    ["register_pytree_node", "register_pytree_node_class", "register_static", "register_dataclass"],
)
def test_duplicate_registration_raises_value_error(first, second, function):
    modules = {"jtu": jtu, "tc": tc}

    @dataclasses.dataclass(frozen=True)
    class Thing:
        x: Any = 1

        def tree_flatten(self) -> Any:
            return (self.x,), None

        @classmethod
        def tree_unflatten(cls, aux: Any, children: Any) -> Any:
            return cls(*children)

    def register(module: Any) -> None:
        if function == "register_pytree_node":
            module.register_pytree_node(Thing, Thing.tree_flatten, Thing.tree_unflatten)
        elif function == "register_dataclass":
            module.register_dataclass(Thing, data_fields=["x"], meta_fields=[])
        else:
            getattr(module, function)(Thing)

    register(modules[first])
    before = tc.tree_structure(Thing(1))
    with pytest.raises(ValueError):
        register(modules[second])
    # the registry still works and still has the first registration
    after = tc.tree_structure(Thing(1))
    assert before == after
    assert repr(after) == repr(jtu.tree_structure(Thing(1)))


BAD_DATACLASS_CALLS = {
    "missing_field": lambda m, c: m.register_dataclass(c, data_fields=["a"], meta_fields=[]),
    "unknown_field": lambda m, c: m.register_dataclass(
        c, data_fields=["a", "b", "zz"], meta_fields=[]
    ),
    "only_data_fields": lambda m, c: m.register_dataclass(c, data_fields=["a", "b"]),
    "only_meta_fields": lambda m, c: m.register_dataclass(c, meta_fields=["a", "b"]),
    "not_a_dataclass": lambda m, c: m.register_dataclass(type("Plain", (), {})),
}


@pytest.mark.parametrize("case", sorted(BAD_DATACLASS_CALLS))
def test_register_dataclass_validation_matches_jax(case):
    def fresh() -> type:
        return dataclasses.make_dataclass(_fresh_name("Bad"), [("a", int), ("b", int)])

    call = BAD_DATACLASS_CALLS[case]
    assert_same_outcome(lambda: call(tc, fresh()), lambda: call(jtu, fresh()), lambda a, b: None)


def test_dataclass_meta_fields_affect_equality():
    a = trees.DataJ(1, 2, name="x", size=1)
    b = trees.DataJ(3, 4, name="x", size=1)
    c = trees.DataJ(1, 2, name="y", size=1)
    assert tc.tree_structure(a) == tc.tree_structure(b)
    assert tc.tree_structure(a) != tc.tree_structure(c)
    assert tc.tree_structure(c).node_data() == jtu.tree_structure(c).node_data()
    d = trees.DataT(1, 2, activation="gelu")
    assert tc.tree_structure(d).node_data() == (trees.DataT, ("gelu",))
    assert tc.tree_unflatten(tc.tree_structure(d), [5, 6]) == trees.DataT(5, 6, "gelu")


def test_static_nodes_have_no_leaves_and_compare_by_value():
    for cls in trees.STATIC_TYPES:
        assert tc.tree_leaves(cls(1)) == []
        assert tc.tree_structure(cls(1)).num_nodes == 1
        assert tc.tree_structure(cls(1)) == tc.tree_structure(cls(1))
        assert hash(tc.tree_structure(cls(1))) == hash(tc.tree_structure(cls(1)))
        assert tc.tree_structure(cls(1)) != tc.tree_structure(cls(2))
        rebuilt = tc.tree_unflatten(tc.tree_structure([cls(5)]), [])
        assert rebuilt == [cls(5)]


def test_registered_types_keep_working_through_jax():
    """Registrations done through treeclone behave identically when JAX itself is used."""
    tree = {"p": trees.PairT(1, 2), "b": trees.BagT([3]), "d": trees.DataT(4, 5)}
    leaves, jax_def = jtu.tree_flatten(tree)
    assert leaves == [3, 4, 5, 1, 2]
    rebuilt = jtu.tree_unflatten(jax_def, leaves)
    assert isinstance(rebuilt["p"], trees.PairT) and rebuilt["d"].activation == "relu"


# --------------------------------------------------------------------------------------------
# thread safety (in a subprocess, so that a crash or deadlock cannot take pytest down)
# --------------------------------------------------------------------------------------------


def test_concurrent_use_while_registering():
    run_script(
        """
import dataclasses, random, threading, traceback
import trees
from helpers import assert_same_objects

N_WORKERS, ITERATIONS, N_REGISTRATIONS = 8, 150, 240
SKIP = trees.BIG_IDS | {"deep_list_300", "deep_mixed_300", "deep_custom_300"}
IDS = [i for i in trees.CORPUS_IDS if i not in SKIP]
errors, registered = [], []
barrier = threading.Barrier(N_WORKERS + 1)

def check_tree(tree):
    leaves, td = tc.tree_flatten(tree)
    jleaves, jtd = jtu.tree_flatten(tree)
    assert_same_objects(leaves, jleaves)
    assert td.to_jax() == jtd, (td, jtd)
    rebuilt = tc.tree_unflatten(td, leaves)
    assert jtu.tree_structure(rebuilt) == jtd
    mapped = tc.tree_map(lambda x: x, tree)
    assert_same_objects(jtu.tree_leaves(mapped), jleaves)
    assert [p for p, _ in tc.tree_flatten_with_path(tree)[0]] == [
        p for p, _ in jtu.tree_flatten_with_path(tree)[0]
    ]

def worker(seed):
    rng = random.Random(seed)
    try:
        barrier.wait(timeout=120)
        for _ in range(ITERATIONS):
            check_tree(trees.CORPUS_BY_ID[rng.choice(IDS)]())
            if registered:
                cls, make = rng.choice(list(registered))
                obj = make()
                check_tree([obj, {"k": obj}])
                assert jtu.tree_structure(obj).num_nodes > 1 or jtu.tree_leaves(obj) == []
    except BaseException:
        errors.append(traceback.format_exc())

def registrar():
    try:
        barrier.wait(timeout=120)
        for i in range(N_REGISTRATIONS):
            module = tc if i % 2 else jtu
            kind = (i // 2) % 3
            if kind == 0:
                cls = type(f"Dyn{i}", (trees._Pair,), {})
                module.register_pytree_node(cls, trees._pair_flatten, trees._pair_unflatten(cls))
                make = lambda cls=cls: cls(trees.Opaque(), [1])
            elif kind == 1:
                cls = dataclasses.make_dataclass(
                    f"DynData{i}",
                    [("x", object), ("m", int, dataclasses.field(default=0, metadata={"static": True}))],
                )
                module.register_dataclass(cls)
                make = lambda cls=cls: cls((1, 2))
            else:
                cls = type(f"DynStatic{i}", (trees._StaticVal,), {})
                module.register_static(cls)
                make = lambda cls=cls: cls(i)
            registered.append((cls, make))
    except BaseException:
        errors.append(traceback.format_exc())

threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in range(N_WORKERS)]
threads.append(threading.Thread(target=registrar, daemon=True))
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=240)
alive = [t.name for t in threads if t.is_alive()]
assert not alive, f"threads did not finish (deadlock?): {alive}"
assert not errors, "\\n".join(errors[:3])
assert len(registered) == N_REGISTRATIONS
for cls, make in registered:
    obj = make()
    assert tc.tree_structure(obj).to_jax() == jtu.tree_structure(obj), cls
"""  # noqa: E501
    )
