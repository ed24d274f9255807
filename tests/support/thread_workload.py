"""A multi-threaded workload on ``treeclone.tree_util``, checked against ``jax.tree_util``.

``run()`` starts ``threads`` workers that flatten, unflatten, tree_map, flatten_up_to,
flatten_with_path and compare treedefs on the corpus trees of ``trees.py`` (and on dicts with
random string keys, which churn the dict key-order cache), while one more thread keeps
registering fresh node types (``register_pytree_node``, ``register_dataclass``, through
treeclone and now and then through JAX directly) and flattening instances of them. Workers also
flatten instances of the freshly registered types.

Every expected value is JAX's, computed before the threads start (for the corpus) or by the
calling thread just before the check (for fresh types). A wrong result or an exception in any
thread is recorded and reported; a thread still running ``join_timeout`` seconds after the
deadline is reported as a deadlock (with every thread's stack on stderr).

Hook for more work: ``run(extra=[callable, ...])``. Each worker calls one of the extra
callables (no arguments) on about one iteration in ``extra_every``; an exception in one of them
is a failure like any other. Run this in a subprocess (tests/hostile/test_threads.py does): a
deadlock or a crash must not take pytest down with it.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import random
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu
import treeclone.tree_util as tc
import trees


@dataclasses.dataclass
class Expected:
    name: str
    tree: Any
    leaves: list
    jax_def: Any
    tc_def: Any
    paths: list


def _expectations() -> list[Expected]:
    out = []
    for name, build in trees.CORPUS:
        tree = build()
        leaves, jax_def = jtu.tree_flatten(tree)
        tc_leaves, tc_def = tc.tree_flatten(tree)
        assert tc_def.to_jax() == jax_def, name
        assert len(tc_leaves) == len(leaves) and all(
            a is b for a, b in zip(tc_leaves, leaves, strict=True)
        ), name
        paths = [p for p, _ in jtu.tree_flatten_with_path(tree)[0]]
        out.append(Expected(name, tree, leaves, jax_def, tc_def, paths))
    return out


def _same_objects(actual: list, expected: list, what: str) -> None:
    assert len(actual) == len(expected), f"{what}: {len(actual)} leaves != {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a is e, f"{what}: leaf {i} is {a!r}, expected {e!r}"


class _Shared:
    def __init__(self, expected: list[Expected]) -> None:
        self.expected = expected
        # jax_eq[i][j]: whether JAX considers the treedefs of trees i and j equal
        self.jax_eq = [[a.jax_def == b.jax_def for b in expected] for a in expected]
        self.fresh: list[tuple[type, Callable[[int], Any]]] = []  # appended by the registrar
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def record(self, what: str) -> None:
        with self.lock:
            self.errors.append(
                f"{threading.current_thread().name} [{what}]\n" + (traceback.format_exc())
            )
        self.stop.set()


# ---- worker operations (each checks its own result) ------------------------------------------


def op_flatten(s: _Shared, rng: random.Random) -> None:
    e = rng.choice(s.expected)
    leaves, td = tc.tree_flatten(e.tree)
    _same_objects(leaves, e.leaves, e.name)
    assert td == e.tc_def, e.name
    if rng.random() < 0.2:
        assert td.to_jax() == e.jax_def, e.name


def op_unflatten(s: _Shared, rng: random.Random) -> None:
    e = rng.choice(s.expected)
    rebuilt = (
        e.tc_def.unflatten(e.leaves)
        if rng.random() < 0.5
        else tc.tree_unflatten(e.tc_def, iter(e.leaves))
    )
    leaves, jax_def = jtu.tree_flatten(rebuilt)
    assert jax_def == e.jax_def, e.name
    _same_objects(leaves, e.leaves, e.name)


def op_tree_map(s: _Shared, rng: random.Random) -> None:
    e = rng.choice(s.expected)
    if rng.random() < 0.5:
        mapped = tc.tree_map(lambda x: x, e.tree)
    else:
        mapped = tc.tree_map(lambda x, y: x, e.tree, e.tree)
    leaves, jax_def = jtu.tree_flatten(mapped)
    assert jax_def == e.jax_def, e.name
    _same_objects(leaves, e.leaves, e.name)


def op_compare(s: _Shared, rng: random.Random) -> None:
    i, j = rng.randrange(len(s.expected)), rng.randrange(len(s.expected))
    a, b = s.expected[i], s.expected[j]
    fresh = tc.tree_structure(b.tree)
    eq = a.tc_def == fresh
    assert eq == s.jax_eq[i][j], (a.name, b.name, eq)
    assert (a.tc_def != fresh) is (not eq), (a.name, b.name)
    if eq:
        assert hash(a.tc_def) == hash(fresh), (a.name, b.name)


def op_flatten_up_to(s: _Shared, rng: random.Random) -> None:
    e = rng.choice(s.expected)
    _same_objects(e.tc_def.flatten_up_to(e.tree), e.leaves, e.name)


def op_with_path(s: _Shared, rng: random.Random) -> None:
    e = rng.choice(s.expected)
    pairs, td = tc.tree_flatten_with_path(e.tree)
    assert [p for p, _ in pairs] == e.paths, e.name
    _same_objects([x for _, x in pairs], e.leaves, e.name)
    assert td == e.tc_def, e.name


def op_random_dict(s: _Shared, rng: random.Random) -> None:
    # fresh key strings (new identities) churn the key-order cache past its size limit
    keys = [f"k{rng.randrange(10**6)}" for _ in range(rng.randrange(1, 12))]
    d = {k: i for i, k in enumerate(keys)}
    leaves, td = tc.tree_flatten({"outer": d, "n": None})
    assert leaves == [d[k] for k in sorted(d)], (d, leaves)
    assert td.to_jax() == jtu.tree_structure({"outer": d, "n": None})


def op_fresh_type(s: _Shared, rng: random.Random) -> None:
    if not s.fresh:
        return
    cls, make = rng.choice(s.fresh)
    tree = {"x": [make(1), (make(2), None)], "y": make(3)}
    jax_leaves, jax_def = jtu.tree_flatten(tree)
    leaves, td = tc.tree_flatten(tree)
    _same_objects(leaves, jax_leaves, cls.__name__)
    assert td.to_jax() == jax_def, cls.__name__
    rebuilt = td.unflatten(leaves)
    assert jtu.tree_structure(rebuilt) == jax_def, cls.__name__


OPS: list[tuple[str, Callable[[_Shared, random.Random], None], float]] = [
    ("flatten", op_flatten, 3),
    ("unflatten", op_unflatten, 2),
    ("tree_map", op_tree_map, 2),
    ("compare", op_compare, 2),
    ("flatten_up_to", op_flatten_up_to, 1),
    ("with_path", op_with_path, 1),
    ("random_dict", op_random_dict, 1),
    ("fresh_type", op_fresh_type, 2),
]


def _worker(s: _Shared, seed: int, extra: Sequence[Callable[[], Any]], extra_every: int) -> None:
    rng = random.Random(seed)
    names = [n for n, _, _ in OPS]
    fns = {n: f for n, f, _ in OPS}
    weights = [w for _, _, w in OPS]
    local: Counter[str] = Counter()
    while not s.stop.is_set():
        if extra and rng.randrange(extra_every) == 0:
            name = "extra"
            fn = rng.choice(extra)
            try:
                fn()
            except Exception:
                s.record(f"extra callable {fn!r}")
                break
        else:
            name = rng.choices(names, weights)[0]
            try:
                fns[name](s, rng)
            except Exception:
                s.record(name)
                break
        local[name] += 1
    with s.lock:
        s.counts.update(local)


# ---- the registrar ---------------------------------------------------------------------------


def _fresh_pytree_class(i: int, via: Any) -> tuple[type, Callable[[int], Any]]:
    cls = type(f"Fresh{i}", (), {"__init__": lambda self, a, b: self.__dict__.update(a=a, b=b)})
    via.register_pytree_node(
        cls,
        lambda n: ((n.a, n.b), f"aux{i}"),
        lambda aux, ch, cls=cls: cls(*ch),
    )
    return cls, lambda v, cls=cls: cls(v, [v, {"w": v}])


def _fresh_dataclass(i: int, via: Any) -> tuple[type, Callable[[int], Any]]:
    cls = dataclasses.make_dataclass(f"FreshData{i}", [("w", Any), ("b", Any), ("meta", str)])
    via.register_dataclass(cls, data_fields=["w", "b"], meta_fields=["meta"])
    return cls, lambda v, cls=cls: cls((v,), None, f"m{v % 2}")


def _registrar(s: _Shared, seed: int) -> None:
    rng = random.Random(seed)
    i = 0
    try:
        while not s.stop.is_set():
            via = jtu if i % 5 == 4 else tc  # JAX's own registration must be seen as well
            make_cls = _fresh_dataclass if i % 2 else _fresh_pytree_class
            cls, make = make_cls(i, via)
            tree = [make(i), {"k": make(i + 1)}]
            jax_leaves, jax_def = jtu.tree_flatten(tree)
            leaves, td = tc.tree_flatten(tree)
            _same_objects(leaves, jax_leaves, cls.__name__)
            assert td.to_jax() == jax_def, cls.__name__
            s.fresh.append((cls, make))
            # and instances of an older fresh type
            old_cls, old_make = rng.choice(s.fresh)
            old = [old_make(7)]
            assert tc.tree_structure(old).to_jax() == jtu.tree_structure(old), old_cls.__name__
            i += 1
            time.sleep(0.0005)  # let the workers see each registration
    except Exception:
        s.record(f"registrar, type #{i}")
    with s.lock:
        s.counts["registrations"] += i


def run(
    extra: Sequence[Callable[[], Any]] = (),
    threads: int = 8,
    seconds: float = 10.0,
    extra_every: int = 10,
    join_timeout: float = 60.0,
    seed: int = 0,
) -> Counter[str]:
    """Run the workload; raise AssertionError on any wrong result, error or deadlock.

    Returns how many times each operation ran (plus ``registrations``).
    """
    expected = _expectations()
    s = _Shared(expected)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings
    workers = [
        threading.Thread(
            target=_worker,
            args=(s, seed * 1000 + k, list(extra), extra_every),
            name=f"worker-{k}",
            daemon=True,
        )
        for k in range(threads)
    ]
    workers.append(
        threading.Thread(target=_registrar, args=(s, seed), name="registrar", daemon=True)
    )
    try:
        for t in workers:
            t.start()
        s.stop.wait(seconds)
        s.stop.set()
        deadline = time.monotonic() + join_timeout
        stuck = []
        for t in workers:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                stuck.append(t.name)
    finally:
        sys.setswitchinterval(old_interval)
    if stuck:
        faulthandler.dump_traceback(all_threads=True)
        raise AssertionError(f"threads still running {join_timeout}s after the end: {stuck}")
    if s.errors:
        raise AssertionError(f"{len(s.errors)} thread(s) failed:\n" + "\n".join(s.errors[:5]))
    return s.counts


if __name__ == "__main__":
    counts = run(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
    print(dict(counts))
