"""Shared assertions for differential testing against ``jax.tree_util``."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu

# JAX's own one-level flatten: exported by jax.tree_util from 0.10 on, in jax._src.tree_util on
# every supported release (0.6 on).
from jax._src.tree_util import flatten_one_level as jax_flatten_one_level
from trees import Rec

# This folder: the helper modules and the scripts that tests run in subprocesses.
SUPPORT_DIR = os.path.dirname(os.path.abspath(__file__))
# TREECLONE_LONG=1: the heavier tests (threads, leaks, fuzzing) run longer; CI-sized otherwise.
LONG = os.environ.get("TREECLONE_LONG", "") not in ("", "0")
KEY_TYPES = (jtu.SequenceKey, jtu.DictKey, jtu.GetAttrKey, jtu.FlattenedIndexKey)
_DICT_TYPES = (dict, collections.OrderedDict, collections.defaultdict)


def assert_same_objects(actual: list[Any], expected: list[Any], what: str = "leaves") -> None:
    """Same length and the very same objects (``is``) in the same order."""
    assert isinstance(actual, list), f"{what}: expected a list, got {type(actual).__name__}"
    assert len(actual) == len(expected), f"{what}: {len(actual)} items, JAX has {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a is e, f"{what}[{i}]: {a!r} is not the same object as JAX's {e!r}"


def same_parts(a: Any, b: Any) -> bool:
    """The same object, or tuples (lists: a dict's keys) whose items are the same objects; an
    int equal to it (an nnx.List's keys: flax's ``int(name)`` makes a new one past the small
    ints at every flatten)."""
    if a is b or (type(a) is int and type(b) is int and a == b):
        return True
    return (
        type(a) in (tuple, list)
        and type(a) is type(b)
        and len(a) == len(b)
        and all(same_parts(x, y) for x, y in zip(a, b, strict=True))
    )


def assert_flattens_as_jax(tree: Any) -> None:
    """treeclone's flatten of ``tree`` against JAX's: the same leaves (``is``), and at every node
    the same type and an aux made of the same objects (``same_parts``)."""
    import treeclone.tree_util as tc

    leaves, treedef = tc.tree_flatten(tree)
    jax_leaves, jax_treedef = jtu.tree_flatten(tree)
    assert len(leaves) == len(jax_leaves)
    assert all(a is b for a, b in zip(leaves, jax_leaves, strict=True))
    assert treedef.to_jax() == jax_treedef
    stack = [(treedef, jax_treedef, "root")]
    while stack:
        td, jd, where = stack.pop()
        node, jax_node = td.node_data(), jd.node_data()
        if jax_node is None:
            assert node is None, where
            continue
        assert node[0] is jax_node[0], f"{where}: {node[0]} is not {jax_node[0]}"
        assert same_parts(node[1], jax_node[1]), f"{where}: aux {node[1]!r} != {jax_node[1]!r}"
        kids, jax_kids = td.children(), jd.children()
        assert len(kids) == len(jax_kids), where
        stack.extend(
            (k, j, f"{where}/{i}") for i, (k, j) in enumerate(zip(kids, jax_kids, strict=True))
        )
    assert tc.tree_unflatten(treedef, leaves) is not None


def is_key_path(x: Any) -> bool:
    return isinstance(x, tuple) and type(x) is tuple and all(isinstance(k, KEY_TYPES) for k in x)


def same_leaf(a: Any, b: Any) -> bool:
    """Identity for leaves; for ``Rec`` leaves compare the recorded args (paths by ==)."""
    if a is b:
        return True
    if type(a) is Rec and type(b) is Rec:
        if len(a.args) != len(b.args):
            return False
        for x, y in zip(a.args, b.args, strict=True):
            if is_key_path(x) and is_key_path(y):
                if x != y:
                    return False
            elif type(x) is Rec and type(y) is Rec:
                if not same_leaf(x, y):
                    return False
            elif x is not y:
                return False
        return True
    return False


def assert_same_tree(actual: Any, expected: Any, leaf_eq: Callable[[Any, Any], bool] = same_leaf):
    """``actual`` has JAX's structure, the same leaves, and the same container key order/types."""
    a_leaves, a_def = jtu.tree_flatten(actual)
    e_leaves, e_def = jtu.tree_flatten(expected)
    assert a_def == e_def, f"structure {a_def} != JAX's {e_def}"
    assert len(a_leaves) == len(e_leaves)
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        assert leaf_eq(a, e), f"leaf {i}: {a!r} vs JAX's {e!r}"
    _walk_same(actual, expected, leaf_eq)


def _walk_same(actual: Any, expected: Any, leaf_eq: Callable[[Any, Any], bool]) -> None:
    stack = [(actual, expected, "root")]
    while stack:
        a, e, where = stack.pop()
        assert type(a) is type(e), f"{where}: type {type(a).__name__} != {type(e).__name__}"
        if e is None:
            continue
        if type(e) in _DICT_TYPES:
            assert list(a.keys()) == list(e.keys()), f"{where}: key order {list(a)} != {list(e)}"
            if type(e) is collections.defaultdict:
                assert a.default_factory is e.default_factory, f"{where}: default_factory"
            stack.extend((a[k], e[k], f"{where}[{k!r}]") for k in e)
        elif type(e) in (list, tuple) or (isinstance(e, tuple) and hasattr(e, "_fields")):
            assert len(a) == len(e), f"{where}: length {len(a)} != {len(e)}"
            stack.extend((x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, e, strict=True)))
        elif jtu.tree_structure(e).num_leaves == 1 and jtu.tree_structure(e).num_nodes == 1:
            assert leaf_eq(a, e), f"{where}: leaf {a!r} vs {e!r}"
        else:
            a_children, a_aux = jax_flatten_one_level(a)
            e_children, e_aux = jax_flatten_one_level(e)
            assert a_aux == e_aux, f"{where}: aux {a_aux!r} != {e_aux!r}"
            a_children, e_children = list(a_children), list(e_children)
            assert len(a_children) == len(e_children)
            stack.extend(
                (x, y, f"{where}.<{i}>")
                for i, (x, y) in enumerate(zip(a_children, e_children, strict=True))
            )


def drop_fields_arg(names: Sequence[str]) -> list[Any]:
    """``register_dataclass``'s ``drop_fields`` naming ``names``, in the form the installed JAX
    reads: JAX 0.6 to 0.9 read each entry as an iterable of names (their
    ``init_fields.difference_update(*drop_fields)`` spells "note" out as n, o, t, e; fixed in
    0.10), so there the names go in as one entry."""
    return list(names) if _DROP_FIELDS_ARE_NAMES else [list(names)]


def _drop_fields_are_names() -> bool:
    # Probed on a throwaway dataclass: the failing form raises before registering anything.
    @dataclasses.dataclass
    class DropFieldsProbe:
        kept: Any
        dropped: Any = None

    try:
        jtu.register_dataclass(
            DropFieldsProbe, data_fields=["kept"], meta_fields=[], drop_fields=["dropped"]
        )
    except ValueError:
        return False
    return True


_DROP_FIELDS_ARE_NAMES = _drop_fields_are_names()


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - we compare exception types
        return "err", exc


def assert_same_outcome(
    tc_fn: Callable[[], Any],
    jax_fn: Callable[[], Any],
    compare: Callable[[Any, Any], None],
) -> None:
    """Both succeed (then ``compare(tc_value, jax_value)``) or both raise the same type."""
    jax_kind, jax_val = outcome(jax_fn)
    tc_kind, tc_val = outcome(tc_fn)
    if jax_kind == "err":
        assert tc_kind == "err", f"JAX raised {jax_val!r} but treeclone returned {tc_val!r}"
        assert type(tc_val) is type(jax_val), f"treeclone raised {tc_val!r}, JAX raised {jax_val!r}"
    else:
        assert tc_kind == "ok", f"treeclone raised {tc_val!r} but JAX returned {jax_val!r}"
        compare(tc_val, jax_val)


def capture(fn: Callable[[], Any]) -> BaseException | None:
    """The exception ``fn()`` raises, or None."""
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    return None


def check_same_error(tc_fn: Callable[[], Any], jax_fn: Callable[[], Any], what: str = "") -> None:
    """Both raise, with the same exception type and message (used for propagated errors)."""
    jax_exc = capture(jax_fn)
    tc_exc = capture(tc_fn)
    assert jax_exc is not None, f"{what}: JAX did not raise"
    assert tc_exc is not None, f"{what}: treeclone did not raise (JAX raised {jax_exc!r})"
    assert type(tc_exc) is type(jax_exc), f"{what}: treeclone raised {tc_exc!r}, JAX {jax_exc!r}"
    assert str(tc_exc) == str(jax_exc), f"{what}: message {str(tc_exc)!r} != {str(jax_exc)!r}"


_PATH_SETUP = f"""
import sys
sys.path.insert(0, {SUPPORT_DIR!r})
"""

PRELUDE = (
    _PATH_SETUP
    + """
import faulthandler
faulthandler.enable()  # a crash prints every thread's Python stack to stderr
import jax.tree_util as jtu
import treeclone.tree_util as tc
"""
)


def float_rtol(on_cpu: float = 0.0) -> float:
    """The relative tolerance for a float32 value computed by JAX: ``on_cpu`` on the CPU, where
    the suite's claims were written, and 1e-4 on a TPU or GPU, whose division (a product with
    the reciprocal) and transcendental functions (tanh, exp) differ from the CPU's in the fifth
    or sixth digit. What a test checks stays the same; only the digits it demands change."""
    import jax

    return on_cpu if jax.default_backend() == "cpu" else max(on_cpu, 1e-4)


def child_env(*, drop: Sequence[str] = (), **extra: str) -> dict[str, str]:
    """The environment for a child Python: this one's, on the CPU, less the variables whose
    names start with one of ``drop``, with ``extra`` added. Every test that starts a Python
    child builds its environment here (``tests/test_child_processes.py`` checks it).

    One process at a time can hold a TPU (and a child that opens the GPU the parent holds
    competes for its memory): a child started while pytest runs on an accelerator would fail
    to open it, so every child runs on the CPU, whatever backend the parent uses.
    """
    kept = {k: v for k, v in os.environ.items() if not any(k.startswith(p) for p in drop)}
    return {**kept, "JAX_PLATFORMS": "cpu", **extra}


def check_without_internals(test_file: str, test_name: str) -> None:
    """Run one test of ``test_file`` again in a child pytest that reads none of CPython's
    internals (``TREECLONE_NO_CPYTHON_INTERNALS``), and check it passes there too."""
    here = os.path.abspath(test_file)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", f"{here}::{test_name}", "-q", "-p", "no:cacheprovider"]
        + ["-x"],
        capture_output=True,
        text=True,
        timeout=1200,
        env=child_env(TREECLONE_NO_CPYTHON_INTERNALS="1"),
        cwd=os.path.dirname(os.path.dirname(here)),
    )
    detail = f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0 and "1 passed" in proc.stdout, detail


def run_script(
    body: str,
    marker: str = "SCRIPT-OK",
    timeout: float = 300,
    prelude: bool = True,
    path: Sequence[str] = (),
    cpu_devices: int | None = None,
) -> str:
    """Run ``body`` in a fresh interpreter; it must exit 0 and print ``marker``.

    The script can import the modules of this folder, and those of the folders in ``path``.
    ``cpu_devices``: its CPU backend has that many devices (XLA reads ``XLA_FLAGS`` when JAX
    starts, which it has in the pytest process already). A segfault/abort shows up as a
    negative return code and fails the calling test instead of killing pytest. Returns stdout.
    """
    setup = (PRELUDE if prelude else _PATH_SETUP) + "".join(
        f"sys.path.insert(0, {folder!r})\n" for folder in path
    )
    devices = (
        {}
        if cpu_devices is None
        else {"XLA_FLAGS": f"--xla_force_host_platform_device_count={cpu_devices}"}
    )
    proc = subprocess.run(
        [sys.executable, "-c", _script(setup, body, marker)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(**devices),
        cwd=SUPPORT_DIR,
    )
    return _checked(marker, proc.returncode, proc.stdout, proc.stderr)


def printed_json(stdout: str, marker: str) -> Any:
    """The JSON a child printed after ``marker``, on the first line that starts with it."""
    line = next(line for line in stdout.splitlines() if line.startswith(marker))
    return json.loads(line[len(marker) :])


_RESULTS = "RUN-ALL-RESULTS:"


def run_all_on_cpu_devices(test_file: str, cpu_devices: int) -> Any:
    """What ``run_all()`` of the test module ``test_file`` (its ``__file__``) returns, run in a
    child Python on ``cpu_devices`` CPU devices (``run_script``), through JSON; warnings are
    silenced there. The module's scenarios run in the child, the pytest side reports each
    answer (``check_answer``)."""
    folder, name = os.path.split(os.path.splitext(os.path.abspath(test_file))[0])
    body = f"""
import json
import warnings
warnings.simplefilter("ignore")
import {name}
print({_RESULTS!r} + json.dumps({name}.run_all()))
"""
    stdout = run_script(body, prelude=False, timeout=600, path=[folder], cpu_devices=cpu_devices)
    return printed_json(stdout, _RESULTS)


def check_answer(problem: str | None) -> None:
    """One case's answer from a child: None passes, ``SKIP: why`` skips, anything else is the
    failure."""
    import pytest

    __tracebackhide__ = True  # a skip or failure is reported at the test that checks the answer
    if problem is not None and problem.startswith("SKIP: "):
        pytest.skip(problem[len("SKIP: ") :])
    assert problem is None, problem


def run_warm(body: str, marker: str = "SCRIPT-OK", timeout: float = 300) -> str:
    """``run_script(body, marker, timeout)`` with the prelude, in a process of its own forked
    from an interpreter that has imported the prelude's modules (``forkserver.py``), without
    the 2.5 s of imports each fresh one costs."""
    return _checked(marker, *_FORK_SERVER.run(_script(PRELUDE, body, marker), timeout))


def _script(setup: str, body: str, marker: str) -> str:
    return setup + textwrap.dedent(body) + f"\nprint({marker!r})\n"


def _checked(marker: str, returncode: int, stdout: str, stderr: str) -> str:
    """``stdout`` of a script that exited 0 and printed ``marker``; else an AssertionError
    with the exit (a crash named as such) and both outputs' ends."""
    detail = (
        f"exit code {returncode}"
        + (" (killed by a signal: the process crashed)" if returncode < 0 else "")
        + f"\n--- stdout ---\n{stdout[-4000:]}\n--- stderr ---\n{stderr[-4000:]}"
    )
    assert returncode == 0, detail
    assert marker in stdout, detail
    return stdout


class _ForkServer:
    """This process's ``forkserver.py``, started at its first script and again if it dies."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _server(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, os.path.join(SUPPORT_DIR, "forkserver.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=child_env(),
                cwd=SUPPORT_DIR,
            )
            assert self._proc.stdout is not None
            assert json.loads(self._proc.stdout.readline()) == {"ready": True}
        return self._proc

    def run(self, code: str, timeout: float) -> tuple[int, str, str]:
        """The script's exit code (negative: the signal that killed it), stdout and stderr."""
        with self._lock, tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            proc = self._server()
            assert proc.stdin is not None and proc.stdout is not None
            request = {"code": code, "stdout": out, "stderr": err, "timeout": timeout}
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            reply = proc.stdout.readline()
            if not reply:
                raise RuntimeError("the fork server died (tests/support/forkserver.py)")
            if json.loads(reply).get("timeout"):
                raise subprocess.TimeoutExpired("forked script", timeout)
            with open(out) as o, open(err) as e:
                return json.loads(reply)["returncode"], o.read(), e.read()


_FORK_SERVER = _ForkServer()
