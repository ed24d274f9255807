"""``treeclone.shard_map``: ``jax.shard_map`` with a policy.

It takes ``jax.shard_map``'s arguments (``mesh``, ``in_specs``, ``out_specs``, ``axis_names``,
``check_vma``) plus ``policy=``: ``"clone"`` (the default: the call is ``jax.shard_map``'s own),
``"alias"`` (in-place mutations of the inputs reach the caller's objects, as in plain Python,
as global arrays with their input's sharding) or ``"strict"`` (an input mutated and not
returned is a :class:`~treeclone.MutationError` naming the argument and key path), or a
:class:`~treeclone.Policy`. A ``with treeclone.policy(...)`` block overrides the policy of every
call made inside it.

Under a policy other than ``clone`` the call is flattened with identity (the same array passed
twice is one input, given one in_spec), the function runs on the arguments rebuilt from
``jax.shard_map``'s per-device blocks, and what it did to them comes back as the plan
``treeclone.jit`` uses (``treeclone._lift``). The function's result is ``jax.shard_map``'s
output under ``out_specs``; each value written into an input is one more output of the
``jax.shard_map``, whose out_spec is that input's in_spec, so the global array written back has
the shape and sharding of the input it replaces. ``docs/semantics.md`` (rules S1-S10) states
the rules and names their tests.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from collections.abc import Callable, Mapping, Set
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.core import Tracer
from jax.sharding import PartitionSpec

from treeclone import _lift
from treeclone._docs import see
from treeclone._jax_compat import flatten_one_level_with_keys, prefix_errors
from treeclone._lift import Naming, StaticLeaves, StaticOut, jit_keystr, leaf_rule, reporting
from treeclone.policies import (
    CLONE,
    ArgPolicies,
    Policy,
    PolicySpec,
    as_policy,
)

__all__ = ["shard_map"]

# jax.shard_map's own default for in_specs (``jax.sharding.Infer``; None on jax 0.6).
_IN_SPECS_DEFAULT: Any = inspect.signature(jax.shard_map).parameters["in_specs"].default
_OUT_SPECS_PREFIX = re.compile(r"out_specs\[0\]")


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def _spec_axes(spec: PartitionSpec) -> set[Any]:
    """The mesh axes a PartitionSpec splits over."""
    axes: set[Any] = set()
    for entry in spec:
        if entry is None:
            continue
        axes.update(entry if isinstance(entry, tuple) else (entry,))
    return axes


def _varying(aval: Any) -> set[Any]:
    """The mesh axes a value inside ``shard_map`` may vary over (``aval.mat.varying``; the
    ``vma`` of jax before 0.10)."""
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return set(getattr(mat, "varying", ()))
    return set(getattr(aval, "vma", ()) or ())


class _PathSpecs:
    """Names and in_specs of key paths in a call's positional arguments (``(SequenceKey(i),
    ...)`` paths, as ``jax.tree_util`` gives them for the ``args`` tuple)."""

    def __init__(self, naming: Naming, in_specs: Any):
        self.naming = naming
        self.entries = jax.tree_util.tree_flatten_with_path(in_specs, is_leaf=_is_spec)[0]

    def name(self, path: tuple) -> str:
        if path and isinstance(path[0], jax.tree_util.SequenceKey):
            return self.naming.name(path[0].idx) + jit_keystr(path[1:])
        return "args" + jit_keystr(path)

    def spec(self, path: tuple) -> Any:
        """The in_spec that covers ``path``; KeyError when in_specs has none (a place the
        function added under a container whose in_specs are given per entry)."""
        for prefix, spec in self.entries:
            if tuple(path[: len(prefix)]) == tuple(prefix):
                return spec
        raise KeyError(path)


def _result_places(
    out: Any, out_specs: Any
) -> tuple[dict[int, int], dict[int, list[tuple[str, Any]]]]:
    """Where each array of the result is: ``id(leaf) -> its first index`` among the result's
    leaves, and ``id(leaf) -> [(its place in the result, its out_spec), ...]``."""
    out_index: dict[int, int] = {}
    for i, leaf in enumerate(jax.tree_util.tree_leaves(out)):
        out_index.setdefault(id(leaf), i)
    out_specs_of: dict[int, list[tuple[str, Any]]] = {}

    def visit(path: tuple, spec: Any, sub: Any) -> None:
        for rel, x in jax.tree_util.tree_flatten_with_path(sub)[0]:
            out_specs_of.setdefault(id(x), []).append(("result" + jit_keystr((*path, *rel)), spec))

    try:
        jax.tree_util.tree_map_with_path(visit, out_specs, out, is_leaf=_is_spec)
    except ValueError:
        pass  # not a prefix of the result: jax.shard_map's own error follows
    return out_index, out_specs_of


def _containers(root: tuple) -> list[tuple[Any, tuple]]:
    """The containers (pytree nodes) reachable from the arguments, each once with its first
    key path."""
    found: dict[int, tuple[Any, tuple]] = {}
    agenda: list[tuple[Any, tuple]] = [(root, ())]
    while agenda:
        node, path = agenda.pop()
        flat = flatten_one_level_with_keys(node)
        if flat is None or id(node) in found:
            continue
        if path:  # the args tuple itself is not the caller's object
            found[id(node)] = (node, path)
        for key, child in reversed(flat[0]):
            agenda.append((child, (*path, key)))
    return list(found.values())


def _leaf_places(containers: list[tuple[Any, tuple]]) -> dict[int, list[tuple]]:
    """Where each leaf is after the function ran: ``id(leaf) -> [key path, ...]``, walking
    each input container (by its path before the call) and the new containers under it."""
    inputs = {id(node) for node, _ in containers}
    places: dict[int, list[tuple]] = {}
    for container, path in containers:
        agenda = [(container, path)]
        while agenda:
            node, at = agenda.pop()
            flat = flatten_one_level_with_keys(node)
            if flat is None:
                places.setdefault(id(node), []).append(at)
                continue
            for key, child in flat[0]:
                if id(child) not in inputs:  # an input container is walked from its own path
                    agenda.append((child, (*at, key)))
    return places


class _Body:
    """The function ``jax.shard_map`` maps for one call under a policy: of the call's
    distinct leaves (per-device blocks), it runs the user's function through the lift and
    returns ``(result, written)``: the function's own result, mapped with the user's
    ``out_specs``, and the values written into inputs, each with its input's in_spec (put in
    ``written_specs``, the second half of the out_specs ``jax.shard_map`` was given, before
    ``jax.shard_map`` reads them). ``record``: the plan, where each of its outputs is and the
    outputs the ``traced=`` rule leaves static (never mapped: they come back as they are).
    ``static``: the call's leaves the rule leaves static, given back to the function."""

    def __init__(
        self,
        runner: _lift.Runner,
        call: _lift.Call,
        places: _PathSpecs,
        out_specs: Any,
        check_vma: bool,
        written_specs: list,
    ):
        self.runner, self.sdef, self.places = runner, call.sdef, places
        self.static: StaticLeaves | None = call.static
        self.out_specs, self.check_vma, self.written_specs = out_specs, check_vma, written_specs
        self.__name__ = runner.__name__
        self.__qualname__ = getattr(runner.fun, "__qualname__", runner.__name__)
        self.started = False
        self.record: tuple[Any, list[tuple[str, int]], list] | None = None

    @property
    def __fun_debug_info__(self) -> Any:
        return self.runner.__fun_debug_info__

    def __call__(self, leaves: list) -> tuple[Any, list]:
        self.started = True
        prepared = self.runner.begin(self.sdef, list(leaves), static=self.static)
        containers = _containers(prepared.args)
        called = prepared.call()
        out = called.out
        planned = called.diff().plan()
        plan, outputs = planned.plan, self.runner.outputs(planned)
        rule = self.runner.traced
        if rule is not None:  # the result jax.shard_map maps: its static leaves left out
            flat, out_def = jax.tree_util.tree_flatten(out)
            out = cast(Any, out_def).unflatten(
                [x if isinstance(x, Tracer) or rule(x) else None for x in flat]
            )
        out_index, out_specs_of = _result_places(out, self.out_specs)
        writes = self.runner.policy.mutations == "propagate"
        places = _leaf_places(containers) if writes else {}
        sources: list[tuple[str, int]] = []
        written: list[Any] = []
        specs: list[PartitionSpec] = []
        statics: list[Any] = []
        for leaf in outputs:
            if type(leaf) is StaticOut:  # traced= leaves it static: as it is, never mapped
                sources.append(("static", len(statics)))
                statics.append(leaf.value)
                continue
            returned = out_specs_of.get(id(leaf), [])
            for (first, spec), (other, other_spec) in zip(returned, returned[1:], strict=False):
                if other_spec != spec:
                    raise ValueError(
                        see(
                            "one-array-two-shardings",
                            f"{first} and {other}: one array is returned at two places with "
                            f"different out_specs ({spec} and {other_spec}); under this policy "
                            "it stays one array, which cannot have both shardings: return a copy "
                            "(jnp.copy) at one of them, or give them the same out_spec",
                        )
                    )
            at = places.get(id(leaf), [])
            if not at:
                if id(leaf) not in out_index:
                    raise RuntimeError(
                        f"treeclone.shard_map: an output of {self.__name__} is neither in its "
                        "result nor written into an input (a treeclone bug: please report it)"
                    )
                sources.append(("result", out_index[id(leaf)]))
                continue
            spec = self._written_spec(leaf, at)
            returned_spec = returned[0][1] if returned else spec
            if id(leaf) in out_index and returned_spec == spec:
                sources.append(("result", out_index[id(leaf)]))
                continue
            if id(leaf) in out_index:
                raise ValueError(
                    see(
                        "one-array-two-shardings",
                        f"{self.places.name(at[0])}: the value written into this input (in_spec "
                        f"{spec}) is also returned with out_spec {returned_spec}; it is one "
                        "array, which cannot have both shardings: return a copy (jnp.copy), or "
                        "give the two places the same spec",
                    )
                )
            sources.append(("written", len(written)))
            written.append(leaf)
            specs.append(spec)
        self.written_specs[:] = specs
        self.record = (plan, sources, statics)
        return out, written

    def _written_spec(self, leaf: Any, at: list[tuple]) -> PartitionSpec:
        """The in_spec of the input places ``leaf`` is written into, checked against it."""
        name = self.places.name(at[0])
        specs = []
        for path in at:
            try:
                specs.append(self.places.spec(path))
            except KeyError:
                raise ValueError(
                    see(
                        "shard-map-write-back",
                        f"{self.places.name(path)}: a value is written into the inputs at a place "
                        "in_specs gives no spec for (a new entry of a container whose in_specs are "
                        "given per entry); give the container one in_spec for all its entries",
                    )
                ) from None
        spec = specs[0]
        for path, other in zip(at[1:], specs[1:], strict=True):
            if other != spec:
                raise ValueError(
                    see(
                        "one-array-two-shardings",
                        f"{name} and {self.places.name(path)}: one value is written into two "
                        f"inputs with different in_specs ({spec} and {other}); under this policy "
                        "it is one array, which cannot have both shardings: write a copy into one "
                        "of them",
                    )
                )
        if spec is None:
            raise ValueError(
                see(
                    "shard-map-write-back",
                    f"{name}: a value is written into an input whose in_spec is None (a static "
                    "input); give it a PartitionSpec to write traced values into it",
                )
            )
        try:
            aval = jax.typeof(leaf)
        except TypeError:
            return spec  # not a JAX value: jax.shard_map's own error follows
        if len(spec) > aval.ndim:
            raise ValueError(
                see(
                    "shard-map-write-back",
                    f"{name}: the value written into this input has shape {aval.str_short()}, of "
                    f"rank {aval.ndim}, less than the length of its in_spec {spec}, with which it "
                    "is written back; write a value of the input's rank",
                )
            )
        varying = _varying(aval)
        extra = sorted(map(str, varying - _spec_axes(spec)))
        if self.check_vma and extra:
            axes = ", ".join(repr(a) for a in extra)
            raise ValueError(
                see(
                    "shard-map-write-back",
                    f"{name}: the value written into this input varies across mesh axis {axes} "
                    f"(it may differ from device to device), but its in_spec {spec} says the input "
                    "is replicated there, and it is written back with that spec; reduce it over "
                    f"the axis first (jax.lax.pmean, psum, ...), or give the input an in_spec "
                    "that splits it over that axis",
                )
            )
        return spec


class _ShardMap(_lift.Wrapper):
    """What :func:`shard_map` returns (see there)."""

    name = "shard_map"

    def __init__(
        self,
        fun: Callable[..., Any],
        policy: PolicySpec | ArgPolicies,
        options: dict[str, Any],
        traced: str | Callable[[Any], bool] | None = None,
    ):
        if not callable(fun):
            jax.shard_map(fun, **options)  # jax's own TypeError
        self._options = options
        self._traced = leaf_rule(traced)
        super().__init__(fun, policy)

    def make_jax(self) -> Callable[..., Any]:
        return jax.shard_map(reporting(self._fun), **self._options)

    def make_runner(self, policy: Policy | ArgPolicies) -> _lift.Runner:
        runner = _lift.Runner(self._fun, policy, self._naming, self._traced)
        runner.traced_for = "shard_map"
        return runner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = self._policy_now()
        lifted = policy is not CLONE or self._traced is not None
        if not lifted or kwargs:  # jax.shard_map takes no keyword arguments: its error
            _lift.check_cycles(self._naming, args, kwargs)
            return self._jax(*args, **kwargs)
        in_specs = self._options["in_specs"]
        if in_specs is _IN_SPECS_DEFAULT or in_specs is None:
            raise TypeError(
                see(
                    "shard-map-write-back",
                    f"treeclone.shard_map with policy {policy!r} needs in_specs: the in_spec of "
                    "each input is the out_spec a value written into it is written back with "
                    "(in_specs inferred from the arguments' shardings is policy='clone' without "
                    "traced= only)",
                )
            )
        call = _lift.flatten_call(self._naming, args, {}, traced=self._traced, hashed=False)
        places = _PathSpecs(self._naming, in_specs)
        slot_specs, slot_names = self._slot_specs(call, in_specs, places)
        written_specs: list = []
        body = _Body(
            self._runner(policy),
            call,
            places,
            self._options["out_specs"],
            bool(self._options["check_vma"]),
            written_specs,
        )
        options = dict(self._options)
        options["in_specs"] = (slot_specs,)
        # The written values' out_specs are known once the function has run: ``body`` fills
        # ``written_specs`` in place before returning, and jax.shard_map matches out_specs
        # to the function's output after calling it (JAX 0.6 to 0.10; the tests would fail
        # on a JAX that read them before). The user's own out_specs are checked by
        # jax.shard_map before the call, as for clone.
        options["out_specs"] = (self._options["out_specs"], written_specs)
        mapped = jax.shard_map(body, **options)
        try:
            with body.runner.calling(call.objects, slot_names):
                result, written = mapped(call.traced_leaves())
        except (ValueError, TypeError) as err:
            if not body.started:  # an input's spec: jax's message on the user's arguments
                self._raise_jax_input_error(args)
                raise
            if body.record is not None and _OUT_SPECS_PREFIX.search(str(err)):
                # jax's message about the result names out_specs[0]...: the user's out_specs
                raise type(err)(_OUT_SPECS_PREFIX.sub("out_specs", str(err))) from None
            raise
        assert body.record is not None
        plan, sources, statics = body.record
        given = {"result": jax.tree_util.tree_leaves(result), "written": written, "static": statics}
        return plan.apply(call.leaves, call.objects, [given[kind][i] for kind, i in sources])

    def _slot_specs(
        self, call: _lift.Call, in_specs: Any, places: _PathSpecs
    ) -> tuple[list, list[str]]:
        """The in_spec of each distinct leaf of the call, and where each leaf JAX is given is
        (its first place; a static one, ``traced=``, is not given). An array at several places
        is one input: they must have the same in_spec."""
        found: dict[int, list[tuple[tuple, Any]]] = {}

        def visit(path: tuple, spec: Any, subtree: Any) -> None:
            for rel, leaf in jax.tree_util.tree_flatten_with_path(subtree)[0]:
                found.setdefault(id(leaf), []).append(((*path, *rel), spec))

        try:
            jax.tree_util.tree_map_with_path(visit, in_specs, call.args, is_leaf=_is_spec)
        except ValueError:
            problem, *_ = prefix_errors(in_specs, call.args)
            raise problem("shard_map in_specs") from None
        count = Counter(id(x) for x in call.leaves)
        used: Counter[int] = Counter()
        specs, names = [], []
        static = frozenset() if call.static is None else call.static.slots
        for s, leaf in enumerate(call.leaves):
            at = found[id(leaf)]
            if s in static:  # not mapped: JAX sees None there (no input to name), any spec
                specs.append(PartitionSpec())
                continue
            k = used[id(leaf)]
            used[id(leaf)] += 1
            if count[id(leaf)] == len(at):  # a Python scalar: each place is its own input
                at = [at[k]]
            (first, spec), *others = at
            for path, other in others:
                if other != spec:
                    raise ValueError(
                        see(
                            "one-array-two-shardings",
                            f"{places.name(first)} and {places.name(path)} are one array, given "
                            f"different in_specs ({spec} and {other}); under this policy an array "
                            "passed at two places is one input (docs/semantics.md, rule J8): give "
                            "both places the same in_spec, or pass a copy",
                        )
                    )
            specs.append(spec)
            names.append(places.name(first))
        return specs, names

    def _raise_jax_input_error(self, args: tuple) -> None:
        """Raise the error ``jax.shard_map`` gives for these arguments' in_specs (it names the
        user's arguments), if it gives one: a probe with the function's name and signature
        that returns a constant, shape-evaluated."""
        fun = self._fun

        def probe(*_: Any) -> jax.Array:
            return jnp.zeros(())

        probe.__name__ = getattr(fun, "__name__", "probe")
        probe.__qualname__ = getattr(fun, "__qualname__", probe.__name__)
        try:
            probe.__signature__ = inspect.signature(fun)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        options = dict(self._options)
        options["out_specs"] = PartitionSpec()
        try:
            jax.eval_shape(jax.shard_map(probe, **options), *args)
        except (ValueError, TypeError) as err:
            raise err from None


@_lift.fun_or_decorator
def shard_map(
    f: Callable[..., Any] | None = None,
    /,
    *,
    out_specs: Any,
    in_specs: Any = _IN_SPECS_DEFAULT,
    mesh: Any = None,
    axis_names: Set[Any] = frozenset(),
    check_vma: bool = True,
    policy: PolicySpec | ArgPolicies = "clone",
    traced: str | Callable[[Any], bool] | None = None,
) -> Callable[..., Any] | _lift.Decorator[Callable[..., Any]]:
    """``jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)`` with a policy.

    The arguments are ``jax.shard_map``'s, with its meanings (``in_specs`` a prefix of the
    positional arguments, ``out_specs`` of the result); without ``f``, the decorator that
    applies them. Under ``clone`` a call is ``jax.shard_map``'s own. Under ``alias`` and
    ``strict`` (which need ``in_specs``):

    * the function sees each device's block of the inputs, as under ``jax.shard_map``, and its
      result is ``jax.shard_map``'s, assembled with ``out_specs`` (a returned input that the
      function left as it was is the caller's own array, rule J7);
    * under ``alias`` a value the function writes into an input in place (``state["n"] =
      ...``) reaches the caller's object as a global array assembled with that input's
      in_spec, so it has the input's shape and sharding. A value written into an input
      whose in_spec replicates it over a mesh axis must not vary over that axis (reduce it
      with ``jax.lax.pmean`` or ``psum`` first): otherwise the call is a ValueError naming
      the input's key path, with the caller untouched;
    * under ``strict`` an input mutated and not returned is a
      :class:`~treeclone.MutationError` naming it.

    ``traced`` decides leaf by leaf what is traced, as for :func:`treeclone.jit`
    (``"arrays"``: equinox's rule, as ``eqx.partition`` around ``jax.shard_map``): the other
    leaves reach the function as they are, never split by ``in_specs``, and one it returns
    comes back as it is, whatever ``out_specs`` says; with ``traced=`` every policy needs
    ``in_specs``.

    >>> import jax, jax.numpy as jnp, numpy as np, treeclone
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    >>> def step(stats, x):
    ...     stats["total"] = stats["total"] + jax.lax.psum(x.sum(), "data")
    ...     stats["calls"] = stats["calls"] + 1
    ...     return x * 2
    >>> stats = {"total": jnp.zeros(()), "calls": jnp.zeros((), jnp.int32)}
    >>> f = treeclone.shard_map(
    ...     step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"), policy="alias"
    ... )
    >>> f(stats, jnp.arange(4.0))
    Array([0., 2., 4., 6.], dtype=float32)
    >>> stats
    {'total': Array(6., dtype=float32), 'calls': Array(1, dtype=int32)}
    >>> g = treeclone.shard_map(
    ...     step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"), policy="strict"
    ... )
    >>> g(stats, jnp.arange(4.0))
    Traceback (most recent call last):
    ...
    treeclone.policies.MutationError: step mutated its inputs in place without returning them ...
    ...
    """
    options: dict[str, Any] = {
        "out_specs": out_specs,
        "in_specs": in_specs,
        "mesh": mesh,
        "axis_names": axis_names,
        "check_vma": check_vma,
    }
    leaf_rule(traced)  # an unknown rule: an error now, not when the decorator is applied
    if not isinstance(policy, (Mapping, ArgPolicies)):
        as_policy(policy)  # an unknown name: an error now, not when the decorator is applied
    if f is None:
        return _lift.Decorator(_ShardMap, policy, options, traced)
    return _ShardMap(f, policy, options, traced)
