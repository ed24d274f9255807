"""The object ``treeclone.jit(f)`` returns, and ``treeclone.jit``'s own signature, against
``jax.jit``'s (issue 11): ``_cache_size()``, ``__signature__``, the TypeErrors of a wrong call,
jax.jit's keywords (each passed on only when given) and the typed overloads.

``jax.jit`` shares one trace cache between wrappers of one function with the same options, and
so does ``treeclone.jit`` (under ``clone`` it is the same cache): a test that compares counts
wraps two distinct but equal functions, one for each.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable
from typing import Any, get_overloads

import jax
import jax.numpy as jnp
import pytest
import treeclone as tc
from helpers import check_same_error

POLICIES = ("clone", "alias", "strict")


def make_add() -> Callable[..., Any]:
    """A new function object each time (its own cache under jax.jit and treeclone.jit)."""

    def add(x, y, *, scale=1.0):
        return (x + y) * scale

    return add


def make_pick() -> Callable[..., Any]:
    def pick(x, n):
        return x[n]

    return pick


# --- _cache_size ---------------------------------------------------------------------------


def _calls() -> list[tuple[tuple, dict]]:
    """A call sequence with repeats, new shapes, a new dtype, a keyword and a weak type."""
    return [
        ((jnp.ones(2), jnp.ones(2)), {}),
        ((jnp.ones(2), jnp.zeros(2)), {}),
        ((jnp.ones(3), jnp.ones(3)), {}),
        ((jnp.ones(3, jnp.int32), jnp.ones(3, jnp.int32)), {}),
        ((jnp.ones(2), jnp.ones(2)), {"scale": 2.0}),
        ((jnp.ones(2), jnp.ones(2)), {"scale": 3.0}),
        ((jnp.ones(2), 1.0), {}),
        ((jnp.ones(2), jnp.ones(2)), {}),
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_cache_size_counts_as_jax_jit_does(policy: str) -> None:
    # No argument is shared and nothing is mutated: every policy compiles what jax.jit does.
    ours, theirs = tc.jit(make_add(), policy=policy), jax.jit(make_add())
    assert ours._cache_size() == theirs._cache_size() == 0
    for args, kwargs in _calls():
        ours(*args, **kwargs)
        theirs(*args, **kwargs)
        assert ours._cache_size() == theirs._cache_size(), (args, kwargs)
    assert ours._cache_size() > 1


@pytest.mark.parametrize("policy", POLICIES)
def test_cache_size_with_static_arguments(policy: str) -> None:
    ours = tc.jit(make_pick(), policy=policy, static_argnums=1)
    theirs = jax.jit(make_pick(), static_argnums=1)
    for n in (0, 1, 1, 0, 2):
        ours(jnp.arange(3.0), n)
        theirs(jnp.arange(3.0), n)
        assert ours._cache_size() == theirs._cache_size()
    assert ours._cache_size() == 3


def test_cache_size_under_clone_is_jax_jits_own() -> None:
    # Under clone the calls are jax.jit's, of fun wrapped to report discarded mutations when
    # traced: two treeclone.jit of one function share one cache, as two jax.jit do; the
    # cache is not jax.jit(fun)'s own (its entries would not report).
    add = make_add()
    ours, again, theirs = tc.jit(add), tc.jit(add), jax.jit(add)
    ours(jnp.ones(2), jnp.ones(2))
    assert ours._cache_size() == again._cache_size() == 1
    again(jnp.ones(4), jnp.ones(4))
    assert ours._cache_size() == again._cache_size() == 2
    theirs(jnp.ones(4), jnp.ones(4))
    assert theirs._cache_size() == 1


@pytest.mark.parametrize("policy", ["alias", "strict"])
def test_cache_size_counts_sharing_under_preserve(policy: str) -> None:
    # Documented difference: under identity="preserve" sharing is part of the structure.
    ours, theirs = tc.jit(make_add(), policy=policy), jax.jit(make_add())
    a, b = jnp.ones(2), jnp.ones(2)
    for args in [(a, a), (a, b)]:
        ours(*args)
        theirs(*args)
    assert theirs._cache_size() == 1
    assert ours._cache_size() == 2


def test_cache_size_sums_the_policies_used() -> None:
    jitted = tc.jit(make_add())
    alias = jitted.with_policy("alias")
    x = jnp.ones(2)
    jitted(x, x)
    assert jitted._cache_size() == alias._cache_size() == 1
    alias(x, x)
    assert jitted._cache_size() == alias._cache_size() == 2
    with tc.policy("strict"):
        jitted(x, x)
    assert jitted._cache_size() == alias._cache_size() == 3
    jitted.clear_cache()
    assert jitted._cache_size() == alias._cache_size() == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_cache_size_shared_by_wrappers_of_one_function(policy: str) -> None:
    add = make_add()
    first, second = tc.jit(add, policy=policy), tc.jit(add, policy=policy)
    first(jnp.ones(2), jnp.ones(2))
    assert second._cache_size() == 1
    j1, j2 = jax.jit(make_add()), jax.jit(make_add())  # distinct functions: distinct caches
    j1(jnp.ones(2), jnp.ones(2))
    assert j2._cache_size() == 0
    other = tc.jit(make_add(), policy=policy)
    assert other._cache_size() == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_cache_size_after_lower_then_call(policy: str) -> None:
    ours, theirs = tc.jit(make_add(), policy=policy), jax.jit(make_add())
    x = jnp.ones(5)
    for stage in ("lower", "trace", "eval_shape"):
        getattr(ours, stage)(x, x)
        getattr(theirs, stage)(x, x)
        assert ours._cache_size() == theirs._cache_size() == 0, stage
    ours(x, x)
    theirs(x, x)
    assert ours._cache_size() == theirs._cache_size() == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_clear_cache_empties_it(policy: str) -> None:
    ours, theirs = tc.jit(make_add(), policy=policy), jax.jit(make_add())
    for jitted in (ours, theirs):
        jitted(jnp.ones(2), jnp.ones(2))
        jitted.clear_cache()
    assert ours._cache_size() == theirs._cache_size() == 0


# --- __signature__ --------------------------------------------------------------------------


def _annotated(x: jax.Array, y: int = 2, *rest: float, z: str = "z", **kw: Any) -> jax.Array:
    return x


def _positional_only(a, b, /, c):
    return a


class _CallableObject:
    def __call__(self, a, b=1):
        return a


def _with_signature_attribute(*args, **kwargs):
    return args[0]


_with_signature_attribute.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("only", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
)

SIGNATURE_CASES: dict[str, Callable[[], Callable[..., Any]]] = {
    "function": lambda: _annotated,
    "positional-only": lambda: _positional_only,
    "lambda": lambda: lambda x, *, k=0: x,
    "partial": lambda: functools.partial(_annotated, y=3),
    "callable object": _CallableObject,
    "builtin": lambda: len,
    "__signature__ set": lambda: _with_signature_attribute,
}


@pytest.mark.parametrize("case", sorted(SIGNATURE_CASES))
@pytest.mark.parametrize("policy", POLICIES)
def test_signature_is_jax_jits(case: str, policy: str) -> None:
    fun = SIGNATURE_CASES[case]()
    ours, theirs = tc.jit(fun, policy=policy), jax.jit(fun)
    assert isinstance(ours.__signature__, inspect.Signature)
    assert ours.__signature__ == theirs.__signature__
    assert inspect.signature(ours) == inspect.signature(theirs)
    assert ours.with_policy("clone").__signature__ == theirs.__signature__


def test_signature_of_a_jitted_jitted_function() -> None:
    ours, theirs = tc.jit(tc.jit(_annotated)), jax.jit(jax.jit(_annotated))
    assert ours.__signature__ == theirs.__signature__ == inspect.signature(_annotated)


def test_signature_of_a_function_without_one_is_jax_jits_error() -> None:
    # inspect cannot read dict's signature: reading __signature__ raises what jax.jit's raises.
    check_same_error(lambda: tc.jit(dict).__signature__, lambda: jax.jit(dict).__signature__)


def test_signature_of_the_class_itself() -> None:
    # On the class, __signature__ is None: inspect describes Jitted's constructor.
    assert tc.Jitted.__signature__ is None
    assert list(inspect.signature(tc.Jitted).parameters) == [
        "fun",
        "policy",
        "jit_kwargs",
        "discarded_mutations",
        "traced",
        "keep_shardings",
    ]


def test_decorator_form_has_the_signature() -> None:
    @tc.jit(policy="alias", static_argnames="n")
    def power(x, n=2):
        return x**n

    assert power.__signature__ == inspect.signature(power.__wrapped__)
    assert str(power.__signature__) == "(x, n=2)"


# --- wrong calls: jax.jit's TypeErrors -------------------------------------------------------


WRONG_CALLS: dict[str, Callable[[Any], Any]] = {
    "fun by keyword": lambda jit: jit(fun=make_add()),
    "fun by keyword, with options": lambda jit: jit(fun=make_add(), static_argnums=0),
    "two positional": lambda jit: jit(make_add(), 0),
    "unknown keyword": lambda jit: jit(make_add(), static_argnum=0),
    "unknown keyword, decorator form": lambda jit: jit(static_argnum=0),
    "not callable": lambda jit: jit(3),
}


# Before JAX 0.8.1 jax.jit required fun and its wrapper took fun by keyword and options by
# position (against its printed signature); treeclone.jit follows the signature of later JAX.
JAX_JIT_FUN_OPTIONAL = (
    inspect.signature(jax.jit).parameters["fun"].default is not inspect.Parameter.empty
)
SINCE_0_8_1 = ("fun by keyword", "fun by keyword, with options", "two positional")


@pytest.mark.parametrize("case", sorted(WRONG_CALLS))
def test_wrong_call_raises_jax_jits_error_at_once(case: str) -> None:
    if case in SINCE_0_8_1 and not JAX_JIT_FUN_OPTIONAL:
        pytest.skip("jax.jit before JAX 0.8.1 takes this call or words its error differently")
    call = WRONG_CALLS[case]
    check_same_error(lambda: call(tc.jit), lambda: call(jax.jit), case)


@pytest.mark.parametrize("policy", POLICIES)
def test_fun_by_keyword_with_a_policy(policy: str) -> None:
    with pytest.raises(TypeError) as ours:
        tc.jit(fun=make_add(), policy=policy)
    if not JAX_JIT_FUN_OPTIONAL:
        pytest.skip("jax.jit before JAX 0.8.1 takes fun by keyword")
    with pytest.raises(TypeError) as theirs:
        jax.jit(fun=make_add())
    assert str(ours.value) == str(theirs.value)
    assert "positional-only arguments passed as keyword arguments: 'fun'" in str(ours.value)


def test_abstracted_axes_is_what_this_jax_makes_of_it() -> None:
    # A keyword of JAX < 0.8: accepted exactly when this jax.jit has it, else its TypeError,
    # in both forms (the decorator form raises at once, as jax.jit's does).
    if "abstracted_axes" in inspect.signature(jax.jit).parameters:
        tc.jit(make_add(), abstracted_axes=())
        tc.jit(abstracted_axes=())
    else:
        check_same_error(
            lambda: tc.jit(make_add(), abstracted_axes=()),
            lambda: jax.jit(make_add(), abstracted_axes=()),
        )
        check_same_error(lambda: tc.jit(abstracted_axes=()), lambda: jax.jit(abstracted_axes=()))


# --- jax.jit's keywords ----------------------------------------------------------------------


def test_signature_has_jax_jits_keywords() -> None:
    ours = inspect.signature(tc.jit).parameters
    theirs = inspect.signature(jax.jit).parameters
    first = next(iter(ours.values()))
    assert first.name == "fun" and first.kind is inspect.Parameter.POSITIONAL_ONLY
    for name, parameter in theirs.items():
        if name == "fun":
            continue
        assert name in ours, name
        assert ours[name].kind is parameter.kind, name
        # The same defaults (the sharding options' "not given" prints as jax.jit's does).
        assert repr(ours[name].default) == repr(parameter.default), name
    extra = set(ours) - set(theirs)
    assert extra <= {"policy", "discarded_mutations", "traced", "keep_shardings", "abstracted_axes"}
    assert ours["policy"].default == "clone"
    assert ours["discarded_mutations"].default is None  # the global setting (or a block's)
    assert ours["keep_shardings"].default is True  # written-back arrays keep their placement
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in ours.values())


@pytest.fixture
def jax_jit_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of each jax.jit call made while the test runs."""
    calls: list[dict[str, Any]] = []
    original = jax.jit

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(jax, "jit", spy)
    return calls


def test_only_given_keywords_reach_jax_jit(jax_jit_calls: list[dict[str, Any]]) -> None:
    tc.jit(make_add())
    assert jax_jit_calls == [{}]
    jax_jit_calls.clear()
    # A default value given explicitly is the default: not passed on.
    tc.jit(make_add(), keep_unused=False, static_argnums=None, device=None, inline=False)
    assert jax_jit_calls == [{}]
    jax_jit_calls.clear()
    # in_shardings=None is a value (the default is jax.jit's "unspecified"): passed on.
    tc.jit(make_add(), keep_unused=True, in_shardings=None, donate_argnums=(0,))
    assert jax_jit_calls == [{"keep_unused": True, "in_shardings": None, "donate_argnums": (0,)}]
    jax_jit_calls.clear()
    tc.jit(policy="alias", inline=True)(make_add())
    assert jax_jit_calls == [{"inline": True}]


OPTIONS: dict[str, dict[str, Any]] = {
    "keep_unused": {"keep_unused": True},
    "inline": {"inline": True},
    "static_argnums": {"static_argnums": 1},
    "static_argnames": {"static_argnames": "y"},
    "donate_argnums": {"donate_argnums": 0},
    "donate_argnames": {"donate_argnames": "x"},
    "compiler_options": {"compiler_options": {}},
    "shardings": {
        "in_shardings": jax.sharding.SingleDeviceSharding(jax.devices()[0]),
        "out_shardings": jax.sharding.SingleDeviceSharding(jax.devices()[0]),
    },
}


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_keywords_lower_as_jax_jit_does(case: str) -> None:
    def unused_y(x, y):
        return x * 2

    options = OPTIONS[case]
    args = (jnp.ones(3), 1 if "static_argnums" in options or "static_argnames" in options else 1.0)
    ours = tc.jit(unused_y, **options).lower(*args).as_text()
    theirs = jax.jit(unused_y, **options).lower(*args).as_text()
    assert ours == theirs


# --- the two forms, typed ----------------------------------------------------------------------


def test_the_two_forms_come_from_one_signature() -> None:
    # Typed by fun_or_decorator from jit's one signature, with no @overload stub to drift from
    # it (what type checkers see: test_type_checkers_see_the_overloads): with fun a Jitted,
    # without it the decorator that makes one with the options given.
    assert get_overloads(tc.jit) == []
    assert inspect.signature(tc.jit).parameters["fun"].default is None
    decorated = tc.jit(policy="alias", static_argnames="scale")(make_add())
    assert isinstance(decorated, tc.Jitted)
    assert decorated(1.0, 2.0, scale=3.0) == 9.0


def test_type_checkers_see_the_overloads(tmp_path: Any) -> None:
    api = pytest.importorskip("mypy.api")
    source = textwrap.dedent(
        """
        import jax
        import treeclone

        def f(x: jax.Array) -> jax.Array:
            return x

        reveal_type(treeclone.jit(f))
        reveal_type(treeclone.jit(policy="alias", static_argnums=0))
        reveal_type(treeclone.jit(f)._cache_size())
        reveal_type(treeclone.jit(f).__signature__)
        treeclone.jit(f, static_argnum=0)
        """
    )
    (tmp_path / "snippet.py").write_text(source)
    # JAX's and numpy's own types are skipped (Any): what is checked is treeclone's overloads,
    # and analysing JAX took mypy 45 s of CI's time.
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\n[mypy-jax.*,jaxlib.*,numpy.*]\nfollow_imports = skip\n"
        "follow_imports_for_stubs = True\n"
    )
    out, err, _ = api.run(
        [
            "--config-file",
            str(tmp_path / "mypy.ini"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            "--hide-error-context",
            str(tmp_path / "snippet.py"),
        ]
    )
    revealed = [
        line.split("Revealed type is ")[1] for line in out.splitlines() if "Revealed" in line
    ]
    assert revealed == [
        '"treeclone._jit.jitted.Jitted"',
        '"def (def (*Any, **Any) -> Any) -> treeclone._jit.jitted.Jitted"',
        '"int"',
        '"inspect.Signature"',
    ], out + err
    assert 'did you mean "static_argnums"' in out, out + err
