"""``treeclone.jit``: a drop-in for ``jax.jit`` with the call's policy chosen explicitly.

Under ``clone`` (the default) a call is exactly a ``jax.jit`` call: the same object does the
work. Under any other policy the arguments are flattened by treeclone's identity-tracking
flatten; the distinct leaves go to one ``jax.jit`` of an inner function, boxed in a pytree node
whose static data is the arguments' structure with its sharing (so JAX's own cache keys on
it); the inner function rebuilds the arguments, runs the user's function and records, once per
trace, a native ``CallPlan`` that rebuilds the results (and writes mutations back) at every
call. The plan travels as the static data of the output box, so each of JAX's cache entries
carries its own.
"""

from __future__ import annotations

import functools
import inspect
import operator
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from treeclone import _native, _trace
from treeclone.policies import CLONE, Policy, _override, as_policy

# Options that treeclone handles itself under a non-clone policy (the rest go to jax.jit).
_ARG_OPTIONS = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames")
_SHARDINGS = ("in_shardings", "out_shardings")


class _ArgsBox:
    """A call's distinct leaves, with ``key`` (structure, statics, donation) as static data."""

    __slots__ = ("key", "leaves")

    def __init__(self, leaves: list, key: tuple):
        self.leaves = leaves
        self.key = key


class _ResultBox:
    """The computation's outputs, with the trace's ``CallPlan`` as static data."""

    __slots__ = ("leaves", "plan")

    def __init__(self, plan: Any, leaves: Sequence[Any]):
        self.plan = plan
        self.leaves = leaves


# jax flattens an _ArgsBox and rebuilds a _ResultBox at every call: attrgetter and the class
# itself do it without a Python frame. (Rebuilding the result as anything but a _ResultBox
# would take jax.jit off its C++ fast path.)
jax.tree_util.register_pytree_node(
    _ArgsBox, operator.attrgetter("leaves", "key"), lambda key, leaves: _ArgsBox(list(leaves), key)
)
jax.tree_util.register_pytree_node(_ResultBox, operator.attrgetter("leaves", "plan"), _ResultBox)
_native.invalidate_registry_cache()


def _as_tuple(x: int | str | Iterable | None) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


def _parameters(fun: Callable) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None


def _resolve(fun: Callable, nums: Any, names: Any) -> tuple[frozenset[int], frozenset[str]]:
    """Argument positions and names, each completed from the other as jax.jit does."""
    nums, names = set(_as_tuple(nums)), set(_as_tuple(names))
    params = _parameters(fun)
    if params is not None:
        positional = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        nums = {n + len(positional) if n < 0 else n for n in nums}
        names |= {positional[n] for n in nums if 0 <= n < len(positional)}
        nums |= {i for i, name in enumerate(positional) if name in names}
    return frozenset(nums), frozenset(names)


def _hash_static(value: Any) -> None:
    try:
        hash(value)
    except TypeError as exc:
        raise ValueError(
            "Non-hashable static arguments are not supported. An error occurred while trying "
            f"to hash an object of type {type(value)}, {value!r}. The error was:\n"
            f"{type(exc).__name__}: {exc}\n"
        ) from None


def _normalize(indices: frozenset[int], n: int) -> frozenset[int]:
    """Argument positions of one call, negative ones counted from the end as jax.jit does."""
    if all(i >= 0 for i in indices):
        return indices
    return frozenset(i + n if i < 0 else i for i in indices)


def _hashable_options(kwargs: dict[str, Any]) -> tuple | None:
    """``kwargs`` as a hashable key, or None when some option is not hashable."""
    items = []
    for k, v in sorted(kwargs.items()):
        items.append((k, tuple(v) if isinstance(v, list) else v))
    key = tuple(items)
    try:
        hash(key)
    except TypeError:
        return None
    return key


_INNER_ATTR = "__treeclone_inner__"


class Jitted:
    """What ``treeclone.jit(fun, ...)`` returns: call it like the ``jax.jit`` of ``fun``."""

    def __init__(self, fun: Callable, policy: str | Policy, jit_kwargs: dict[str, Any]):
        if not callable(fun):
            raise TypeError(f"Expected a callable value, got {fun!r}")
        self._fun = fun
        self._policy = as_policy(policy)
        self._kwargs = dict(jit_kwargs)
        self._jax_jitted = jax.jit(fun, **jit_kwargs)  # the clone policy, and AOT entry points
        self._static_nums, self._static_names = _resolve(
            fun, jit_kwargs.get("static_argnums"), jit_kwargs.get("static_argnames")
        )
        self._donate_nums, self._donate_names = _resolve(
            fun, jit_kwargs.get("donate_argnums"), jit_kwargs.get("donate_argnames")
        )
        params = _parameters(fun) or []
        self._param_names = [p.name for p in params]
        self._inner = self._inner_cache()
        functools.update_wrapper(self, fun)
        self.__dict__.pop(_INNER_ATTR, None)  # copied from fun's __dict__ by update_wrapper

    def _inner_cache(self) -> dict:
        """Where the inner jax.jit of each policy lives: on ``fun`` itself when possible, so
        that ``jit(f)`` written twice shares one trace cache, as two ``jax.jit(f)`` do."""
        options = _hashable_options(self._kwargs)
        store = getattr(self._fun, "__dict__", None)
        if options is None or not isinstance(store, dict):
            return {}
        # The entry names its owner: functools.wraps copies __dict__ into wrappers (jax.vmap(f)
        # among them), which must not inherit f's compiled code. fun -> its __dict__ -> the
        # entry -> fun is a cycle the garbage collector frees.
        entry = store.get(_INNER_ATTR)
        if not (isinstance(entry, tuple) and entry[0] is self._fun):
            entry = store[_INNER_ATTR] = (self._fun, {})
        return entry[1].setdefault(options, {})

    # --- policies -----------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    def with_policy(self, policy: str | Policy) -> Jitted:
        """The same jitted function under another policy (sharing compiled code)."""
        other = object.__new__(Jitted)
        other.__dict__.update(self.__dict__)
        other._policy = as_policy(policy)
        return other

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = _override.get() or self._policy
        if policy is CLONE:  # presets are canonical objects (as_policy)
            try:
                return self._jax_jitted(*args, **kwargs)
            except (SystemError, RecursionError):
                # jax's flatten fails this way on a cycle; say so, and where.
                _native.flatten((args, kwargs))
                raise
        return self._call_policy(policy, args, kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    # --- the policy path ----------------------------------------------------------------------

    def _call_policy(self, policy: Policy, args: tuple, kwargs: dict) -> Any:
        inner = self._inner.get(policy)
        if inner is None:
            inner = self._inner[policy] = _make_inner(
                self._fun, policy, self._kwargs, self._param_names
            )
        if kwargs and "in_shardings" in self._kwargs:
            raise ValueError("pjit does not support kwargs when in_shardings is specified.")
        statics = None
        positions: Sequence[int] = range(len(args))
        if self._static_nums or self._static_names:
            args, kwargs, statics, positions = self._split_statics(args, kwargs)
        if len(kwargs) > 1:  # keyword order is not part of a call's structure, as in jax.jit
            kwargs = dict(sorted(kwargs.items()))
        leaves, sdef, objects = _native.flatten_shared((*args, kwargs))
        if self._donate_nums or self._donate_names:
            n = len(positions) if statics is None else statics[0]
            keep = self._keep_mask(sdef, positions, n)
            kept = [x for x, k in zip(leaves, keep, strict=True) if k]
            donated = [x for x, k in zip(leaves, keep, strict=True) if not k]
            result = inner(_ArgsBox(kept, (sdef, statics, keep)), donated)
        else:
            result = inner(_ArgsBox(leaves, (sdef, statics, None)), None)
        return result.plan.apply(leaves, objects, result.leaves)

    def _split_statics(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple, list[int]]:
        """Take the static arguments out. Each static value is keyed with its type, as jax.jit
        keys them (``2`` and ``2.0`` are equal but trace differently)."""
        n = len(args)
        static_nums = _normalize(self._static_nums, n)
        static_pos = tuple((i, type(args[i]), args[i]) for i in sorted(static_nums) if i < n)
        static_kw = tuple(
            sorted((k, type(v), v) for k, v in kwargs.items() if k in self._static_names)
        )
        for *_, v in static_pos + static_kw:
            _hash_static(v)
        positions = [i for i in range(n) if i not in static_nums]
        dyn_args = tuple(args[i] for i in positions)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        return dyn_args, dyn_kwargs, (n, static_pos, static_kw), positions

    def _keep_mask(self, sdef: Any, positions: Sequence[int], n: int) -> tuple[bool, ...]:
        """Per distinct leaf: False when every occurrence is in a donated argument.

        ``positions[j]`` is the position, among the call's ``n``, of the j-th dynamic argument.
        """
        donate_nums = _normalize(self._donate_nums, n)
        root = sdef.num_nodes - 1
        kept: set[int] = set()
        donated: set[int] = set()
        per_child = sdef.child_slots(root)
        for j, position in enumerate(positions):
            (donated if position in donate_nums else kept).update(per_child[j])
        kwargs_node = sdef.children_of(root)[len(positions)]
        names = sdef.node_info()[kwargs_node][3] or ()
        for name, slots in zip(names, sdef.child_slots(kwargs_node), strict=True):
            (donated if name in self._donate_names else kept).update(slots)
        return tuple(s in kept or s not in donated for s in range(sdef.num_leaves))

    # --- the rest of jax.jit's interface --------------------------------------------------------

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).lower(...)``: the computation of ``fun`` itself (no policy)."""
        return self._jax_jitted.lower(*args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).trace(...)``."""
        return self._jax_jitted.trace(*args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fun).eval_shape(...)``: shapes of the outputs; nothing is written back."""
        return self._jax_jitted.eval_shape(*args, **kwargs)

    def clear_cache(self) -> None:
        self._jax_jitted.clear_cache()
        for inner in self._inner.values():
            inner.clear_cache()

    def __repr__(self) -> str:
        return f"<treeclone.jit of {self._fun!r} (policy {self._policy!r})>"


def _make_inner(fun: Callable, policy: Policy, kwargs: dict[str, Any], param_names: list[str]):
    """The ``jax.jit`` that runs ``fun`` under ``policy`` on boxed, deduplicated leaves."""
    in_shardings = kwargs.get("in_shardings")
    transform_out = None
    if "out_shardings" in kwargs:
        transform_out = _constrain_outputs(kwargs["out_shardings"])

    def inner(box: _ArgsBox, donated: list | None) -> _ResultBox:
        sdef, statics, keep = box.key
        leaves = list(box.leaves)
        if keep is not None:
            it_kept, it_donated = iter(box.leaves), iter(donated)
            leaves = [next(it_kept) if k else next(it_donated) for k in keep]
        num_args = sdef.node_info()[-1][2] - 1
        if statics is None:
            positions = list(range(num_args))
        else:
            fixed = {i for i, *_ in statics[1]}
            positions = [i for i in range(statics[0]) if i not in fixed]
        names = [param_names[i] if i < len(param_names) else f"args[{i}]" for i in positions]
        if in_shardings is not None:
            leaves = _constrain_inputs(sdef, leaves, num_args, in_shardings)
            # Outputs must carry the shardings: nothing is handed back uncomputed.
            keep = [False] * len(leaves)

        def rebuild(dyn_args: tuple, dyn_kwargs: dict) -> tuple[tuple, dict]:
            if statics is None:
                return dyn_args, dyn_kwargs
            total, static_pos, static_kw = statics
            fixed_values = {i: v for i, _, v in static_pos}
            it = iter(dyn_args)
            full = tuple(fixed_values[i] if i in fixed_values else next(it) for i in range(total))
            return full, {**dyn_kwargs, **{k: v for k, _, v in static_kw}}

        plan, outputs = _trace.run(
            fun,
            sdef,
            leaves,
            _trace.Layout(num_args, names),
            policy,
            rebuild,
            keep_inputs=keep,
            transform_out=transform_out,
        )
        return _ResultBox(plan, outputs)

    inner.__name__ = getattr(fun, "__name__", "fun")
    inner.__qualname__ = getattr(fun, "__qualname__", inner.__name__)
    options = {k: v for k, v in kwargs.items() if k not in _ARG_OPTIONS + _SHARDINGS}
    if kwargs.get("donate_argnums") is not None or kwargs.get("donate_argnames") is not None:
        options["donate_argnums"] = (1,)
    with warnings.catch_warnings():
        # jax.jit already warned about deprecated options when the user's function was wrapped.
        warnings.simplefilter("ignore", DeprecationWarning)
        return jax.jit(inner, **options)


def _shardings_by_leaf(prefix: Any, tree: Any) -> dict[int, Any]:
    """``id(leaf) -> sharding`` for the leaves of ``tree`` under the sharding prefix."""
    found: dict[int, Any] = {}

    def visit(sharding: Any, subtree: Any) -> None:
        for leaf in jax.tree_util.tree_leaves(subtree):
            found[id(leaf)] = sharding

    jax.tree_util.tree_map(visit, prefix, tree, is_leaf=lambda x: x is None)
    return found


def _constrain_inputs(sdef: Any, leaves: list, num_args: int, in_shardings: Any) -> list:
    """Apply ``in_shardings`` (a prefix of the positional arguments) to the input leaves."""
    args = sdef.unflatten(leaves)[:num_args]
    if not isinstance(in_shardings, (tuple, list)):
        in_shardings = (in_shardings,) * num_args
    by_leaf = _shardings_by_leaf(tuple(in_shardings), tuple(args))
    return [
        x if by_leaf.get(id(x)) is None else jax.lax.with_sharding_constraint(x, by_leaf[id(x)])
        for x in leaves
    ]


def _constrain_outputs(out_shardings: Any) -> Callable[[Any], Any]:
    """A function applying ``out_shardings`` (a prefix of the result) to a result."""

    def constrain(out: Any) -> Any:
        by_leaf = _shardings_by_leaf(out_shardings, out)
        return jax.tree_util.tree_map(
            lambda x: (
                x
                if by_leaf.get(id(x)) is None
                else jax.lax.with_sharding_constraint(x, by_leaf[id(x)])
            ),
            out,
        )

    return constrain


def jit(
    fun: Callable | None = None,
    /,
    *,
    policy: str | Policy = "clone",
    **jit_kwargs: Any,
) -> Any:
    """``jax.jit(fun, **jit_kwargs)`` with an explicit policy (``"clone"``, ``"alias"``,
    ``"strict"`` or a :class:`treeclone.Policy`).

    Takes every keyword ``jax.jit`` takes (``in_shardings``, ``out_shardings``,
    ``static_argnums``, ``static_argnames``, ``donate_argnums``, ``donate_argnames``,
    ``keep_unused``, ``device``, ``backend``, ``inline``, ``compiler_options``, ...).
    Without ``fun`` it returns a decorator.
    """
    if fun is None:
        return lambda f: Jitted(f, policy, jit_kwargs)
    return Jitted(fun, policy, jit_kwargs)


__all__: Sequence[str] = ["Jitted", "jit"]
