"""Conformance of ``treeclone.jit`` with ``jax.jit`` (issue 4).

Every scenario is a function ``scenario(jit, count)`` that builds its own functions and inputs
(fresh objects each run: ``jax.jit`` shares its trace cache between wrappers of one function),
wraps them with ``jit`` and returns what the calls gave. ``count()`` is called by the body of
each traced function, so ``count`` ends up holding the number of traces. Each scenario runs once
under ``jax.jit`` and once under ``treeclone.jit`` with a policy; the two runs must agree on:

* the outcome: the same values, dtypes, weak types and tree structure, or the same exception
  type;
* the number of traces.

Every scenario runs under ``clone``. Those where the function does not mutate its inputs and no
array is passed twice also run under ``alias`` and ``strict``; there an output leaf that is an
unchanged input array may come back as the caller's own object, which the comparison allows
(it compares values, not identities).

Known discrepancies are marked ``xfail(strict=True)`` with the reason; each is listed in
``KNOWN`` next to the scenario it breaks.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import profiles
import pytest
import treeclone as tc
from helpers import check_same_error
from hypothesis import given, settings
from jax import lax

POLICIES = ("clone", "alias", "strict")

pytestmark = [
    pytest.mark.filterwarnings("ignore:Some donated buffers were not usable:UserWarning"),
    pytest.mark.filterwarnings("ignore:backend and device argument on jit is deprecated"),
]

# --- known discrepancies (reasons of the xfail marks) ---------------------------------------------

# Differences by design (docs/semantics.md), checked in tests/policies/test_policies.py instead.
PASSTHROUGH = (
    "by design (docs/semantics.md rule J7; test_alias_unchanged_python_values_are_handed_back): "
    "alias/strict hand back a returned input leaf that is not a jax.Array (a Python scalar, a "
    "NumPy array) as the caller's own object, where jax.jit returns a jax.Array"
)
# --- running and comparing ----------------------------------------------------------------------


class Counter:
    """Counts the executions of a traced function's body."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def jit_of(kind: str) -> Callable[..., Any]:
    """``jax.jit`` for ``"jax"``, else ``treeclone.jit`` with that policy (same signature)."""
    if kind == "jax":
        return jax.jit

    def jit(fun: Any = None, /, **kwargs: Any) -> Any:
        return tc.jit(fun, policy=kind, **kwargs)

    return jit


@dataclasses.dataclass
class Run:
    value: Any
    error: BaseException | None
    traces: int


def run(scenario: Callable[..., Any], kind: str) -> Run:
    count = Counter()
    try:
        return Run(scenario(jit_of(kind), count), None, count.n)
    except Exception as exc:  # noqa: BLE001 - exception types are compared
        return Run(None, exc, count.n)


def assert_same_leaf(actual: Any, expected: Any, where: str) -> None:
    if isinstance(expected, jax.Array):
        assert isinstance(actual, jax.Array), f"{where}: {type(actual)!r}, jax.jit gave a jax.Array"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.weak_type == expected.weak_type, f"{where}: weak_type differs"
        if jnp.issubdtype(expected.dtype, jnp.inexact):
            np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-6)
        else:
            np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))
    else:
        assert type(actual) is type(expected), f"{where}: {type(actual)!r} != {type(expected)!r}"
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def assert_same_value(actual: Any, expected: Any) -> None:
    a_leaves, a_def = jax.tree_util.tree_flatten(actual)
    e_leaves, e_def = jax.tree_util.tree_flatten(expected)
    assert a_def == e_def, f"structure {a_def} != jax.jit's {e_def}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        assert_same_leaf(a, e, f"leaf {i}")


def assert_conforms(actual: Run, expected: Run) -> None:
    if expected.error is not None:
        assert actual.error is not None, (
            f"jax.jit raised {expected.error!r}; treeclone.jit returned {actual.value!r}"
        )
        assert type(actual.error) is type(expected.error), (
            f"treeclone.jit raised {actual.error!r}; jax.jit raised {expected.error!r}"
        )
    else:
        if actual.error is not None:
            raise AssertionError(
                f"treeclone.jit raised {actual.error!r}; jax.jit returned {expected.value!r}"
            ) from actual.error
        assert_same_value(actual.value, expected.value)
    assert actual.traces == expected.traces, (
        f"treeclone.jit traced {actual.traces} times, jax.jit {expected.traces} times"
    )


def conforms(scenario: Callable[..., Any], policy: str) -> None:
    assert_conforms(run(scenario, policy), run(scenario, "jax"))


# --- the scenarios --------------------------------------------------------------------------------

SCENARIOS: dict[str, Callable[..., Any]] = {}
CLONE_ONLY: set[str] = set()
KNOWN: dict[tuple[str, str], str] = {}
DESIGNED: dict[tuple[str, str], str] = {}

# Scenarios that need a jax.jit feature the installed JAX lacks (skipped, with the reason).
# Before JAX 0.8.1 jax.jit required fun: there is no decorator form jax.jit(**options).
JAX_JIT_FUN_OPTIONAL = (
    inspect.signature(jax.jit).parameters["fun"].default is not inspect.Parameter.empty
)
UNAVAILABLE: dict[str, str] = {}
if not JAX_JIT_FUN_OPTIONAL:
    UNAVAILABLE["decorator_factory"] = (
        "jax.jit before JAX 0.8.1 requires fun (no decorator form jax.jit(**options))"
    )


def scenario(
    *,
    clone_only: bool = False,
    known: dict[str, str] | None = None,
    designed: dict[str, str] | None = None,
):
    """Register ``sc_<name>``; ``known`` maps a policy to the reason it is expected to fail,
    ``designed`` to the documented rule by which it differs from jax.jit on purpose."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = fn.__name__.removeprefix("sc_")
        SCENARIOS[name] = fn
        if clone_only:
            CLONE_ONLY.add(name)
        for policy, reason in (known or {}).items():
            KNOWN[(name, policy)] = reason
        for policy, reason in (designed or {}).items():
            DESIGNED[(name, policy)] = reason
        return fn

    return register


def both(reason: str) -> dict[str, str]:
    return {"alias": reason, "strict": reason}


def vec(n: int = 3, dtype: Any = jnp.float32) -> jax.Array:
    return jnp.arange(n, dtype=dtype)


def cpu_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


class Pair(NamedTuple):
    a: Any
    b: Any


# The signature: every keyword jax.jit takes, and the ways of applying jit.

KEYWORDS: dict[str, Callable[[], dict[str, Any]]] = {
    "in_shardings": lambda: {"in_shardings": cpu_sharding()},
    "out_shardings": lambda: {"out_shardings": cpu_sharding()},
    "static_argnums": lambda: {"static_argnums": 1},
    "static_argnames": lambda: {"static_argnames": "n"},
    "donate_argnums": lambda: {"donate_argnums": 0},
    "donate_argnames": lambda: {"donate_argnames": "x"},
    "keep_unused": lambda: {"keep_unused": True},
    "device": lambda: {"device": jax.devices()[0]},
    "backend": lambda: {"backend": "cpu"},
    "inline": lambda: {"inline": True},
    "compiler_options": lambda: {"compiler_options": {"xla_cpu_enable_fast_math": False}},
}


def _keyword_scenario(options: Callable[[], dict[str, Any]]) -> Callable[..., Any]:
    def sc(jit, count):
        def f(x, n, y, unused):
            count()
            return {"out": x * n + y, "shape": jnp.zeros(3) + n}

        g = jit(f, **options())
        results = []
        for n in (2, 2, 3):
            x = vec()
            results.append((g(x, n, vec(), vec(2)), x.is_deleted()))
        return results

    return sc


for _name, _options in KEYWORDS.items():
    SCENARIOS[f"keyword_{_name}"] = _keyword_scenario(_options)


@scenario()
def sc_all_keywords(jit, count):
    def f(x, n, y, unused):
        count()
        return {"out": x * n + y}

    g = jit(
        f,
        in_shardings=cpu_sharding(),
        out_shardings=cpu_sharding(),
        static_argnums=1,
        donate_argnames="x",
        keep_unused=True,
        inline=True,
        compiler_options={},
    )
    results = []
    for n in (2, 2, 3):
        x = vec()
        results.append((g(x, n, vec(), vec(2)), x.is_deleted()))
    return results


@scenario()
def sc_decorator(jit, count):
    @jit
    def f(x, y):
        count()
        return x * y + 1

    return [f(vec(), 2.0), f(vec(), 3.0), f(vec(4), 2.0)]


@scenario()
def sc_call_form(jit, count):
    def f(x, d):
        count()
        return {"a": x + d["b"], "c": [x.sum(), None], "t": Pair(x, d["b"] * 2)}

    g = jit(f)
    return [g(vec(), {"b": vec()}), g(vec(), {"b": 1.0}), g(vec(), {"b": vec()})]


@scenario()
def sc_decorator_factory(jit, count):
    @jit(static_argnums=1)
    def f(x, n):
        count()
        return jnp.tile(x, n)

    return [f(vec(), 2), f(vec(), 2), f(vec(), 3), f(vec(), n=3)]


@scenario()
def sc_partial_decorator(jit, count):
    @functools.partial(jit, static_argnums=(1,), static_argnames="mode")
    def f(x, n, mode="sum"):
        count()
        return getattr(jnp, mode)(x * n)

    return [f(vec(), 2), f(vec(), 2, mode="sum"), f(vec(), 2, mode="max"), f(vec(), n=2)]


@scenario()
def sc_method_static_self(jit, count):
    class Scaler:
        def __init__(self, k):
            self.k = k

        def __hash__(self):
            return hash(self.k)

        def __eq__(self, other):
            return isinstance(other, Scaler) and other.k == self.k

        @functools.partial(jit, static_argnums=0)
        def scale(self, x):
            count()
            return x * self.k

    return [
        Scaler(2).scale(vec()),
        Scaler(2).scale(vec()),
        Scaler(3).scale(vec()),
        Scaler.scale(Scaler(3), vec()),
    ]


@scenario()
def sc_method_pytree_self(jit, count):
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Affine:
        w: jax.Array
        b: jax.Array

        @jit
        def apply(self, x):
            count()
            return x * self.w + self.b

        @jit
        def __call__(self, x):
            count()
            return x - self.b

    m = Affine(vec(), jnp.ones(3))
    return [m.apply(vec()), m.apply(vec()), Affine(vec(), 2.0).apply(vec()), m(vec())]


@scenario()
def sc_not_callable(jit, count):
    return jit(3)


@scenario()
def sc_unknown_keyword(jit, count):
    return jit(lambda x: x, not_a_jit_option=1)


@scenario()
def sc_static_argnums_out_of_range(jit, count):
    return jit(lambda x: x, static_argnums=3)


# Ahead-of-time entry points.


@scenario()
def sc_lower_compile(jit, count):
    def f(x, y):
        count()
        return jnp.sin(x) * y

    g = jit(f)
    lowered = g.lower(vec(), 2.0)
    compiled = lowered.compile()
    return [lowered.as_text(), compiled(vec(), 3.0), compiled(vec(), 4.0), hlo(compiled.as_text())]


def hlo(text: str) -> str:
    """Compiled HLO text without its debug metadata (the Python stack frames differ)."""
    header, _, rest = text.partition("\n")
    if "StackFrames" in rest:
        rest = rest.split("StackFrames", 1)[1].split("\n\n", 1)[-1]
    return header + re.sub(r",? ?(stack_frame_id=\d+|metadata=\{[^}]*\})", "", rest)


@scenario()
def sc_lower_static(jit, count):
    def f(x, n):
        count()
        return jnp.tile(x, n)

    g = jit(f, static_argnums=1)
    compiled = g.lower(vec(), 2).compile()
    return [compiled(vec()), g.lower(vec(), 3).as_text()]


@scenario()
def sc_trace(jit, count):
    def f(x, d):
        count()
        return {"s": x * d["k"], "t": jnp.cos(x)}

    traced = jit(f).trace(vec(), {"k": 2.0})
    return [str(traced.jaxpr), traced.lower().compile()(vec(), {"k": 3.0})]


@scenario()
def sc_eval_shape(jit, count):
    def f(x, y):
        count()
        return {"a": x * y, "b": (x.astype(jnp.int32), y)}

    g = jit(f)
    return [g.eval_shape(vec(), 2.0), g.eval_shape(vec(5), vec(5)), jax.eval_shape(g, vec(), 1)]


@scenario()
def sc_clear_cache(jit, count):
    def f(x):
        count()
        return x * 2

    g = jit(f)
    out = [g(vec()), g(vec())]
    g.clear_cache()
    out += [g(vec()), g(vec())]
    return out


def _aot_then_call(method: str) -> Callable[..., Any]:
    def sc(jit, count):
        def f(x, y):
            count()
            return x * y

        g = jit(f)
        getattr(g, method)(vec(), 2.0)
        return [g(vec(), 2.0), g(vec(), 3.0)]

    return sc


for _method in ("lower", "trace", "eval_shape"):
    SCENARIOS[f"{_method}_then_call"] = _aot_then_call(_method)


# Composition with transformations and other jits.


def _loss(count: Counter) -> Callable[..., Any]:
    def loss(w, x):
        count()
        return jnp.sum(jnp.tanh(x @ w["a"] + w["b"]) ** 2)

    return loss


def _params() -> tuple[dict, jax.Array]:
    return {"a": jnp.full((3, 2), 0.1), "b": jnp.ones(2)}, jnp.arange(6.0).reshape(2, 3)


@scenario()
def sc_grad(jit, count):
    g = jax.grad(jit(_loss(count)))
    w, x = _params()
    return [g(w, x), g(w, x), g(jax.tree.map(lambda p: p * 2, w), x)]


@scenario()
def sc_value_and_grad(jit, count):
    g = jax.value_and_grad(jit(_loss(count)), argnums=(0, 1))
    w, x = _params()
    return [g(w, x), g(w, x * 2)]


@scenario()
def sc_grad_inside_jit(jit, count):
    g = jit(jax.grad(_loss(count)))
    w, x = _params()
    return [g(w, x), g(w, x)]


@scenario()
def sc_vmap(jit, count):
    def f(x, y):
        count()
        return {"p": x * y, "q": x.sum()}

    g = jax.vmap(jit(f), in_axes=(0, None))
    xs = jnp.arange(6.0).reshape(2, 3)
    return [g(xs, 2.0), g(xs, 3.0), jit(jax.vmap(f))(xs, jnp.ones(2))]


@scenario()
def sc_vmap_passthrough(jit, count):
    def f(x, y):
        count()
        return x, y * 2

    return jax.vmap(jit(f))(jnp.ones((2, 3)), jnp.ones(2))


@scenario()
def sc_scan_body(jit, count):
    def body(carry, x):
        count()
        return carry + x, carry * x

    xs, jitted = jnp.arange(5.0), jit(body)
    return [lax.scan(jitted, 0.0, xs), lax.scan(jitted, 1.0, xs), jitted(0.0, 1.0)]


@scenario()
def sc_scan_inside_jit(jit, count):
    def body(carry, x):
        count()
        return carry + x, carry * x

    g = jit(lambda c, xs: lax.scan(body, c, xs))
    return [g(0.0, jnp.arange(5.0)), g(1.0, jnp.arange(5.0))]


@scenario()
def sc_jvp_linearize_vjp(jit, count):
    def f(x, z):
        count()
        return jnp.sin(x) * z, x

    g = jit(f)
    primal, tangent = jax.jvp(g, (vec(), 2.0), (jnp.ones(3), 1.0))
    _, f_lin = jax.linearize(g, vec(), 2.0)
    _, f_vjp = jax.vjp(g, vec(), 2.0)
    return [primal, tangent, f_lin(jnp.ones(3), 1.0), f_vjp((jnp.ones(3), jnp.ones(3)))]


@scenario()
def sc_hessian_checkpoint(jit, count):
    def f(x):
        count()
        return jnp.sum(jnp.sin(x) * x**2)

    g = jit(f)
    return [jax.hessian(g)(vec()), jax.grad(jax.checkpoint(g))(vec()), jax.hessian(g)(vec())]


@scenario()
def sc_cond_branches(jit, count):
    def add(x):
        count()
        return x + 1

    def sub(x):
        count()
        return x - 1

    branches = jit(add), jit(sub)
    return [lax.cond(p, *branches, vec()) for p in (True, False, jnp.asarray(True))]


@scenario()
def sc_disable_jit(jit, count):
    def f(x, y):
        count()
        return {"a": x * 2 + y, "b": x.sum()}

    g = jit(f)
    with jax.disable_jit():
        out = [g(vec(), vec()), g(vec(), 1.0)]
    return [*out, g(vec(), vec())]


def _nested(outer_kind: str | None, inner_kind: str | None) -> Callable[..., Any]:
    """Nested jits; a kind of None means "the jit under test"."""

    def sc(jit, count):
        outer_jit = jit if outer_kind is None else jit_of(outer_kind)
        inner_jit = jit if inner_kind is None else jit_of(inner_kind)

        def inner(x):
            count()
            return jnp.sin(x) + 1

        g_inner = inner_jit(inner)

        def outer(x):
            return g_inner(x) * 2 + g_inner(x + 1)

        g = outer_jit(outer)
        return [g(vec()), g(vec()), g(vec(4)), g_inner(vec())]

    return sc


SCENARIOS["nested_both"] = _nested(None, None)
SCENARIOS["nested_inside_jax_jit"] = _nested("jax", None)
SCENARIOS["nested_around_jax_jit"] = _nested(None, "jax")


@scenario()
def sc_jax_jit_of_jitted(jit, count):
    def f(x):
        count()
        return x + 1

    g = jax.jit(jit(f))
    return [g(vec()), g(vec())]


# Retracing.


@scenario()
def sc_rewrap_same_function(jit, count):
    def f(x):
        count()
        return x * 2

    return [jit(f)(vec()) for _ in range(3)]


@scenario()
def sc_retrace_shapes_dtypes(jit, count):
    def f(x):
        count()
        return x * 2

    g = jit(f)
    args = [vec(), vec(), vec(4), vec(3, jnp.int32), vec(3, jnp.int32), np.arange(3.0, dtype="f4")]
    args += [jnp.ones((3, 1)), vec(3, jnp.bfloat16), jnp.array([True, False])]
    return [g(a) for a in args]


@scenario()
def sc_retrace_python_scalars(jit, count):
    def f(x, s):
        count()
        return x * s, s + 1

    g = jit(f)
    scalars = [1.0, 2.0, 3, 4, True, 1.5, jnp.float32(2), np.float32(3), jnp.asarray(2.0)]
    return [g(vec(), s) for s in scalars]


@scenario()
def sc_retrace_scalar_only(jit, count):
    def f(s):
        count()
        return s * 2

    g = jit(f)
    return [g(s) for s in (1.0, 2.0, 1, 7, True, False, 2.5)]


@scenario()
def sc_retrace_static(jit, count):
    def f(x, n):
        count()
        return x * n

    g = jit(f, static_argnums=1)
    return [g(vec(), 2), g(vec(), 2), g(vec(), 3), g(vec(), n=3), g(vec(), n=3), g(vec(), 2)]


@scenario()
def sc_retrace_static_argnames(jit, count):
    def f(x, *, scale, shift=0.0):
        count()
        return x * scale + shift

    g = jit(f, static_argnames=("scale", "shift"))
    return [g(vec(), scale=2), g(vec(), scale=2), g(vec(), scale=3), g(vec(), scale=2, shift=1.0)]


@scenario()
def sc_retrace_static_hashable_objects(jit, count):
    def f(x, spec):
        count()
        return x.reshape(spec[0]) * spec[1]

    g = jit(f, static_argnums=1)
    return [g(vec(6), ((2, 3), 2)), g(vec(6), ((2, 3), 2)), g(vec(6), ((3, 2), 2))]


@scenario()
def sc_retrace_static_in_var_kwargs(jit, count):
    def f(x, **options):
        count()
        return x * len(options["mode"])

    g = jit(f, static_argnames="mode")
    return [g(vec(), mode="ab"), g(vec(), mode="ab"), g(vec(), mode="abc")]


@scenario()
def sc_retrace_static_value_types(jit, count):
    def f(x, k):
        count()
        return x * k

    g = jit(f, static_argnums=1)
    ints = vec(2, jnp.int32)
    return [g(ints, 2), g(ints, 2.0), g(ints, 1), g(ints, True)]


@scenario()
def sc_retrace_kwargs_positional(jit, count):
    def f(a, b, c=1.0):
        count()
        return a * b + c

    g = jit(f)
    calls = [
        lambda: g(vec(), vec()),
        lambda: g(vec(), vec()),
        lambda: g(vec(), b=vec()),
        lambda: g(a=vec(), b=vec()),
        lambda: g(b=vec(), a=vec()),
        lambda: g(vec(), vec(), 1.0),
        lambda: g(vec(), vec(), c=1.0),
        lambda: g(vec(), vec(), c=2.0),
    ]
    return [call() for call in calls]


@scenario()
def sc_retrace_kwargs_only(jit, count):
    def f(**kwargs):
        count()
        return kwargs["a"] - kwargs["b"]

    g = jit(f)
    return [g(a=vec(), b=vec()), g(b=vec(), a=vec() + 1), g(a=vec(), b=vec(), c=None)]


@scenario()
def sc_retrace_structure(jit, count):
    def f(tree):
        count()
        return jax.tree.map(lambda x: x + 1, tree)

    g = jit(f)
    trees = [
        {"a": vec(), "b": [vec(), None]},
        {"b": [vec(), None], "a": vec()},
        {"a": vec(), "b": [vec(), vec()]},
        {"a": vec(), "b": (vec(), None)},
        Pair(vec(), {"c": vec()}),
        Pair(vec(), {"c": vec()}),
        [],
        (),
        None,
    ]
    return [g(t) for t in trees]


@scenario()
def sc_default_args(jit, count):
    def f(x, y=2.0, z=None):
        count()
        return x * y if z is None else x * y + z

    g = jit(f)
    return [g(vec()), g(vec()), g(vec(), 2.0), g(vec(), z=vec()), g(vec(), 3.0, None)]


@scenario()
def sc_negative_static_varargs(jit, count):
    def f(*args):
        count()
        return jnp.zeros(args[-1]) + args[0]

    g = jit(f, static_argnums=-1)
    return [g(1.0, 3), g(2.0, 3), g(1.0, 4)]


@scenario()
def sc_negative_static_argnums(jit, count):
    def f(x, n):
        count()
        return jnp.zeros(n) + x

    g = jit(f, static_argnums=-1)
    return [g(1.0, 3), g(2.0, 3), g(1.0, 4)]


# What comes back.


@scenario()
def sc_returns_input_array(jit, count):
    def f(x, y):
        count()
        return {"x": x, "y": y, "s": x + y}

    g = jit(f)
    return [g(vec(), vec()), g(vec(), jnp.ones(3))]


@scenario(designed=both(PASSTHROUGH))
def sc_returns_python_scalar_input(jit, count):
    def f(x, s):
        count()
        return x * 2, s

    return jit(f)(vec(), 2.0)


@scenario(designed=both(PASSTHROUGH))
def sc_returns_numpy_input(jit, count):
    def f(x):
        count()
        return x

    return jit(f)(np.arange(3.0))


@scenario()
def sc_returns_constants(jit, count):
    def f(x):
        count()
        return {"one": 1.0, "two": 2, "none": None, "arr": np.arange(2), "t": True, "x": x + 1}

    return jit(f)(vec())


@scenario()
def sc_returns_nothing(jit, count):
    def f(x):
        count()

    return [jit(f)(vec()), jit(lambda: 3.0)()]


# Errors.


@scenario()
def sc_error_string_leaf(jit, count):
    def f(x, s):
        count()
        return x

    return jit(f)(vec(), "hello")


@scenario()
def sc_error_object_leaf(jit, count):
    def f(x, o):
        count()
        return x

    return jit(f)(vec(), object())


@scenario()
def sc_error_unhashable_static(jit, count):
    def f(x, n):
        count()
        return x

    return jit(f, static_argnums=1)(vec(), [1, 2])


@scenario()
def sc_error_array_as_static(jit, count):
    def f(x, n):
        count()
        return x

    return jit(f, static_argnums=1)(vec(), vec())


@scenario()
def sc_error_deleted_input(jit, count):
    def f(x):
        count()
        return x + 1

    x = vec()
    x.delete()
    return jit(f)(x)


@scenario()
def sc_error_unhashable_static_keyword(jit, count):
    def f(x, n):
        count()
        return x

    return jit(f, static_argnames="n")(vec(), n={"a": 1})


@scenario()
def sc_error_too_few_arguments(jit, count):
    def f(x, y):
        count()
        return x + y

    return jit(f)(vec())


@scenario()
def sc_error_too_many_arguments(jit, count):
    def f(x, y):
        count()
        return x + y

    return jit(f)(vec(), vec(), vec())


@scenario()
def sc_error_unexpected_keyword(jit, count):
    def f(x, y):
        count()
        return x + y

    return jit(f)(vec(), z=vec())


@scenario()
def sc_error_raised_by_function(jit, count):
    def f(x):
        count()
        raise KeyError("raised inside")

    return jit(f)(vec())


@scenario()
def sc_error_then_success(jit, count):
    def f(x):
        count()
        if x.ndim == 2:
            raise ValueError("no matrices")
        return x * 2

    g = jit(f)
    out = []
    for x in (vec(), jnp.ones((2, 2)), vec(), jnp.ones((2, 2)), vec(4)):
        try:
            out.append(g(x))
        except ValueError as exc:
            out.append(str(exc))
    return out


@scenario()
def sc_error_returns_string(jit, count):
    def f(x):
        count()
        return "not an array"

    return jit(f)(vec())


@scenario()
def sc_error_shape_mismatch(jit, count):
    def f(x, y):
        count()
        return x + y

    return jit(f)(vec(3), vec(4))


@scenario()
def sc_error_in_shardings_with_kwargs(jit, count):
    def f(x, y):
        count()
        return x + y

    return jit(f, in_shardings=cpu_sharding())(vec(), y=vec())


# Donation (CPU supports donation: jax.jit deletes the donated arrays).


@scenario()
def sc_donate_argnums(jit, count):
    def f(x, y):
        count()
        return x * 2 + y

    g = jit(f, donate_argnums=0)
    out = []
    for _ in range(2):
        x, y = vec(), vec()
        out.append((g(x, y), x.is_deleted(), y.is_deleted()))
    return out


@scenario()
def sc_donate_argnames(jit, count):
    def f(x, y):
        count()
        return x * 2 + y

    g = jit(f, donate_argnames="y")
    x, y, z = vec(), vec(), vec()
    return [g(x, y=y), x.is_deleted(), y.is_deleted(), g(z, vec()), z.is_deleted()]


@scenario()
def sc_donate_argnums_passed_by_keyword(jit, count):
    def f(x, y):
        count()
        return x * 2 + y

    x, y = vec(), vec()
    return [jit(f, donate_argnums=0)(x=x, y=y), x.is_deleted(), y.is_deleted()]


@scenario()
def sc_donate_returned_input(jit, count):
    def f(x, y):
        count()
        return x, x * y

    x, y = vec(), vec()
    out = jit(f, donate_argnums=0)(x, y)
    return [out, x.is_deleted(), out[0].is_deleted(), y.is_deleted()]


@scenario()
def sc_donate_tuple_argument(jit, count):
    def f(t, y):
        count()
        return t[0] + y, t[1] * 2

    t, y = (vec(), vec()), vec()
    return [jit(f, donate_argnums=0)(t, y), [a.is_deleted() for a in t], y.is_deleted()]


@scenario()
def sc_donate_dict_argument(jit, count):
    def f(d, y):
        count()
        return d["p"] + y

    p, q = vec(), vec(2)
    d = {"p": p, "q": q}
    out = jit(f, donate_argnums=0)(d, vec())
    return [out, p.is_deleted(), q.is_deleted(), d["p"] is p, d["q"] is q]


@scenario()
def sc_donate_list_argument(jit, count):
    def f(xs):
        count()
        return xs[0] * 2

    xs = [vec()]
    first = xs[0]
    out = jit(f, donate_argnums=0)(xs)
    return [out, first.is_deleted(), xs[0] is first]


@scenario()
def sc_donate_after_static(jit, count):
    def f(n, x, y):
        count()
        return x * n + y

    x, y = vec(), vec()
    out = jit(f, static_argnums=0, donate_argnums=1)(2, x, y)
    return [out, x.is_deleted(), y.is_deleted()]


@scenario()
def sc_donate_before_static(jit, count):
    def f(x, n, y):
        count()
        return x * n + y

    x, y = vec(), vec()
    out = jit(f, static_argnums=1, donate_argnums=0)(x, 2, y)
    return [out, x.is_deleted(), y.is_deleted()]


# Clone only: the function mutates its inputs, or one array is passed twice.


@scenario(clone_only=True)
def sc_clone_mutations_discarded(jit, count):
    def f(d, xs):
        count()
        d["new"] = d["x"] * 2
        xs.append(1.0)
        return d["x"] + len(xs), d["new"]

    d, xs = {"x": vec()}, [vec()]
    g = jit(f)
    return [g(d, xs), g(d, xs), sorted(d), len(xs)]


@scenario(clone_only=True)
def sc_clone_array_passed_twice(jit, count):
    def f(a, b):
        count()
        return a * 2 + b

    x, y = vec(), vec()
    g = jit(f)
    return [g(x, y), g(x, x), g({"a": x}["a"], x)]


@scenario(clone_only=True)
def sc_clone_shared_container(jit, count):
    def f(a, b):
        count()
        a.append(b[0])
        return len(a), len(b), a[0] + b[0]

    shared = [vec()]
    g = jit(f)
    return [g(shared, shared), g([vec()], [vec()]), len(shared)]


def _cases():
    for name in SCENARIOS:
        for policy in POLICIES:
            if policy != "clone" and name in CLONE_ONLY:
                continue
            reason = KNOWN.get((name, policy))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            if (name, policy) in DESIGNED:
                marks = [pytest.mark.skip(reason=DESIGNED[(name, policy)])]
            if name in UNAVAILABLE:
                marks = [pytest.mark.skip(reason=UNAVAILABLE[name])]
            yield pytest.param(name, policy, id=f"{name}-{policy}", marks=marks)


_REFERENCE: dict[str, Run] = {}


@pytest.mark.parametrize(("name", "policy"), list(_cases()))
def test_conforms(name: str, policy: str) -> None:
    actual = run(SCENARIOS[name], policy)
    if name not in _REFERENCE:  # jax.jit's run, shared by the three policies' tests
        _REFERENCE[name] = run(SCENARIOS[name], "jax")
    assert_conforms(actual, _REFERENCE[name])


# --- the rest of the interface ------------------------------------------------------------------


# jax.jit's keywords on older JAX releases only, not exercised here: abstracted_axes (JAX 0.6
# and 0.7, experimental, removed in 0.8), which treeclone.jit passes on to jax.jit as given.
OLD_KEYWORDS = {"abstracted_axes"}


def test_every_jax_jit_keyword_is_covered() -> None:
    params = inspect.signature(jax.jit).parameters.values()
    keywords = {p.name for p in params if p.kind is p.KEYWORD_ONLY} - OLD_KEYWORDS
    assert keywords == set(KEYWORDS), "jax.jit's keywords changed: update KEYWORDS"


@pytest.mark.parametrize("policy", POLICIES)
def test_wraps_metadata(policy: str) -> None:
    def f(x, y=1):
        """The docstring."""
        return x * y

    f.custom_attribute = "kept"
    jitted, reference = tc.jit(f, policy=policy), jax.jit(f)
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        assert getattr(jitted, attr) == getattr(reference, attr), attr
    assert jitted.__wrapped__ is f
    assert reference.__wrapped__ is f
    assert inspect.signature(jitted) == inspect.signature(reference)
    assert jitted.with_policy("alias").__wrapped__ is f
    assert tc.jit(policy=policy)(f).__name__ == "f"


@pytest.mark.parametrize("policy", POLICIES)
def test_function_error_message_propagates(policy: str) -> None:
    def boom(x):
        raise KeyError(f"bad input of shape {x.shape}")

    check_same_error(lambda: tc.jit(boom, policy=policy)(vec()), lambda: jax.jit(boom)(vec()))


@pytest.mark.parametrize("policy", POLICIES)
def test_unhashable_static_message(policy: str) -> None:
    def f(x, n):
        return x

    check_same_error(
        lambda: tc.jit(f, policy=policy, static_argnums=1)(vec(), [1]),
        lambda: jax.jit(f, static_argnums=1)(vec(), [1]),
    )


@pytest.mark.parametrize(
    "policy",
    [
        "clone",
        "alias",
        "strict",
    ],
)
@pytest.mark.parametrize("option", ["device", "backend"])
def test_deprecated_options_warn_like_jax_jit(policy: str, option: str) -> None:
    def count_warnings(jit: Callable[..., Any]) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = jit(lambda x: x * 2, **KEYWORDS[option]())
            g(vec())
            g(vec())
        return sum(issubclass(w.category, DeprecationWarning) for w in caught)

    assert count_warnings(jit_of(policy)) == count_warnings(jax.jit)


def test_array_passed_twice_with_donation() -> None:
    def f(a, b):
        return a * 2 + b

    # jax.jit donates the buffer of argument 0 and then reads the same buffer as argument 1:
    # XLA rejects the execution ("Attempt to use a buffer that was previously donated in the
    # same call"). clone is jax.jit, so it does the same.
    for jit in (jax.jit, tc.jit):
        x = vec()
        with pytest.raises(jax.errors.JaxRuntimeError, match="donated"):
            jit(f, donate_argnums=0)(x, x)
    # alias/strict see one array used by a donated and a non-donated argument: it is not
    # donated (only a leaf whose every occurrence is donated is), and the call succeeds.
    for policy in ("alias", "strict"):
        x = vec()
        out = tc.jit(f, policy=policy, donate_argnums=0)(x, x)
        np.testing.assert_array_equal(out, [0.0, 3.0, 6.0])
        assert not x.is_deleted()
        # Donated by every occurrence: donated once.
        y = vec()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = tc.jit(f, policy=policy, donate_argnums=(0, 1))(y, y)
        np.testing.assert_array_equal(out, [0.0, 3.0, 6.0])
        assert y.is_deleted()


# --- policy selection -----------------------------------------------------------------------


def _mutating(count: Counter) -> Callable[..., Any]:
    def step(state, x):
        count()
        state["n"] = state["n"] + 1
        return x * state["n"]

    return step


def _state() -> dict:
    return {"n": jnp.asarray(0)}


def _observe(jitted: Any) -> tuple[str, Any]:
    """What a call of a mutating function did: ``("discarded"|"propagated"|"error", ...)``."""
    state = _state()
    try:
        out = jitted(state, vec())
    except tc.MutationError:
        assert int(state["n"]) == 0
        return "error", None
    return ("propagated" if int(state["n"]) == 1 else "discarded"), out


def test_policy_argument_selects_policy() -> None:
    count = Counter()
    assert tc.jit(_mutating(count)).policy == tc.CLONE
    assert _observe(tc.jit(_mutating(count)))[0] == "discarded"
    assert _observe(tc.jit(_mutating(count), policy="clone"))[0] == "discarded"
    assert _observe(tc.jit(_mutating(count), policy="alias"))[0] == "propagated"
    assert _observe(tc.jit(_mutating(count), policy="strict"))[0] == "error"
    assert _observe(tc.jit(policy="alias")(_mutating(count)))[0] == "propagated"
    _, out = _observe(tc.jit(_mutating(count), policy="alias"))
    _, ref = _observe(jax.jit(_mutating(count)))
    np.testing.assert_array_equal(out, ref)
    with pytest.raises(ValueError):
        tc.jit(_mutating(count), policy="no such policy")


def test_with_policy() -> None:
    jitted = tc.jit(_mutating(Counter()), policy="alias")
    strict = jitted.with_policy("strict")
    assert strict.policy == tc.STRICT
    assert jitted.policy == tc.ALIAS
    assert _observe(strict)[0] == "error"
    assert _observe(jitted)[0] == "propagated"
    assert _observe(jitted.with_policy("clone"))[0] == "discarded"
    assert _observe(jitted.with_policy(tc.ALIAS))[0] == "propagated"


def test_policy_context_overrides() -> None:
    jitted = tc.jit(_mutating(Counter()), policy="strict")
    with tc.policy("alias"):
        assert _observe(jitted)[0] == "propagated"
        assert _observe(jitted.with_policy("strict"))[0] == "propagated"
        with tc.policy("clone"):
            assert _observe(jitted)[0] == "discarded"
        assert _observe(jitted)[0] == "propagated"
    assert _observe(jitted)[0] == "error"
    with tc.policy("clone"):
        assert _observe(jitted)[0] == "discarded"


def test_policy_is_part_of_cache_key() -> None:
    count = Counter()

    def f(x, d):
        count()
        return {"y": x * d["k"]}

    jitted = tc.jit(f)
    ref = jax.jit(lambda x, d: {"y": x * d["k"]})
    expected = ref(vec(), {"k": 2.0})
    for policy in ("clone", "alias", "strict"):
        assert_same_value(jitted.with_policy(policy)(vec(), {"k": 2.0}), expected)
    assert count.n == 3
    for policy in ("strict", "alias", "clone", "alias"):
        assert_same_value(jitted.with_policy(policy)(vec(), {"k": 2.0}), expected)
    with tc.policy("alias"):
        jitted(vec(), {"k": 2.0})
    with tc.policy("strict"):
        jitted.with_policy("alias")(vec(), {"k": 2.0})
    tc.jit(f, policy="alias")  # a new wrapper has its own cache; nothing is called here
    assert count.n == 3
    jitted(vec(4), {"k": 2.0})
    jitted.with_policy("alias")(vec(4), {"k": 2.0})
    assert count.n == 5


# --- random shapes and dtypes -----------------------------------------------------------------

_SHAPES = [(), (2,), (3,), (2, 3)]
_KINDS = ["float32", "int32", "bool", "float16", "python_float", "python_int", "numpy_float32"]


def _make(shape: tuple, kind: str) -> Any:
    if kind == "python_float":
        return 1.5
    if kind == "python_int":
        return 2
    if kind == "numpy_float32":
        return np.ones(shape, np.float32)
    return jnp.ones(shape, kind)


@pytest.mark.parametrize("policy", POLICIES)
# each example compiles up to four calls under jax.jit and treeclone: 6 examples under ci,
# scaled with the profile (tests/support/profiles.py)
@settings(max_examples=profiles.max_examples(6), deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(_SHAPES), st.sampled_from(_KINDS), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_retrace_random(policy: str, calls: list) -> None:
    def sc(jit, count):
        def f(x, y=None):
            count()
            return {"x": x * 2, "y": None if y is None else y + x}

        g = jit(f)
        return [g(_make(s, k)) if not kw else g(_make(s, k), y=_make(s, k)) for s, k, kw in calls]

    conforms(sc, policy)
