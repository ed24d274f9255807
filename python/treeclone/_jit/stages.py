"""The ahead-of-time stages of ``treeclone.jit`` under a policy: ``jitted.trace(...)``,
``.lower(...)`` and ``.compile()`` give :class:`Traced`, :class:`Lowered` and :class:`Compiled`,
each holding the stage of the inner ``jax.jit`` made for one call (:class:`StagedCall`).

A stage is the computation that runs, so it is traced, lowered and compiled once: calling a
traced or compiled stage is the jitted call with the stage in place of the inner jit, in the
same native call (``_native.StageCall`` over ``_native.LeanCall``: the same flatten and key,
the plan's write-back, strict's arrays, the static leaves put back, ``jit_partial``'s cache
followed; no Python frame of treeclone's once cached), for arguments of the structure, sharing,
static values and static leaves it was made for (another is a TypeError saying what differs).
JAX's introspection (``as_text``, ``cost_analysis``, ``memory_analysis``, ``compiler_ir``,
``jaxpr``, ...) is that of the stage; ``args_info``, ``in_tree``, ``out_tree`` and
``out_info`` (and a compiled stage's ``input_shardings``, ``output_shardings`` and formats)
are in the user's structure. Each stage class subclasses ``jax.stages``' own, so
``isinstance`` and annotated type checks hold.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
from collections.abc import Callable
from typing import Any, NoReturn

import jax

from treeclone import _effects, _jax_compat, _native, _retrace
from treeclone._docs import see
from treeclone._jit.bound import BoundArguments
from treeclone._jit.call import CallShape, JitCall, from_jit_order, lean_call_record
from treeclone._jit.inner import Inner, JitRecord, fun_name
from treeclone._native import FlattenFailed
from treeclone.policies import ArgPolicies, Policy, policy_override


@dataclasses.dataclass(frozen=True, slots=True)
class StageSource:
    """What the stages of a jitted function under one policy need: the user's ``fun``, how
    its calls are taken apart (``shape``), its inner function and ``jax.jit`` (``entry``) and
    the policy's native call (``lean``); for ``jit_partial``, the ``bound`` arguments and the
    ``JitPartial`` itself (``partial``, told after each call whether it replaced bound
    containers); the ``policy`` the stages were traced under, and the wrapper's own
    (``own_policy``: a call outside a ``with treeclone.policy(...)`` block runs under it)."""

    fun: Callable
    shape: CallShape
    entry: tuple[Inner, Any]
    lean: _native.LeanCall
    policy: Policy | ArgPolicies
    own_policy: Policy | ArgPolicies
    bound: BoundArguments | None = None
    partial: Any = None

    def prepare(self, args: tuple, kwargs: dict) -> JitCall:
        """The call of these arguments as the native call hands it to the inner jit
        (``LeanCall.prepare``: the same flatten and key), or the error naming what is wrong
        with them."""
        keyed = self.entry[0].placement.keyed
        try:
            record = self.lean.prepare(args, kwargs, self.bound, keyed)
        except FlattenFailed as exc:
            self.shape.refuse(exc, args, kwargs)
        return lean_call_record(record)

    def check_policy(self) -> None:
        """The policy a call runs under now (a block's, else the wrapper's own) is the one the
        stage was traced under, or a ValueError: what a call does to the caller's objects is
        part of its trace, and a stage cannot trace again."""
        now = policy_override.get() or self.own_policy
        if now is self.policy or now == self.policy:
            return
        raise ValueError(
            see(
                "aot-stage",
                f"{fun_name(self.fun)}: this stage was traced under policy {self.policy!r}, "
                f"and this call runs under {now!r} (a `with treeclone.policy(...)` block, or "
                "the jitted function's own policy): what a call writes back into the caller's "
                "objects is part of the stage's compiled code, so a stage runs under the "
                "policy it was made under only. Trace, lower and compile it under this policy "
                "(inside the block), or call it where its own policy applies.",
            )
        )


def trace(source: StageSource, args: tuple, kwargs: dict) -> Traced:
    """``jitted.trace(*args, **kwargs)``: the inner jit traced for this call, as the call
    would trace it (so a call with the same arguments afterwards finds the trace cached)."""
    call = source.prepare(args, kwargs)
    saved = _native.swap_running_call(call)
    try:
        traced = call.jitted.trace(call.key, call.donated, *call.kept)
    finally:
        _native.swap_running_call(saved)
    info = _jax_compat.traced_out_tree(traced).node_data()[1]
    assert isinstance(info, JitRecord)
    return Traced(StagedCall(source, call, info), traced)


def _layout(call: JitCall, naming: Any) -> _effects.Layout:
    return _effects.Layout(len(call.args), [naming.name(i) for i in call.positions], call.positions)


class StagedCall:
    """The call a stage was made for: its key (structure with sharing, static arguments,
    donation, static leaves), what its trace recorded (``info``), and a record of its
    arguments' types by key path (``_retrace``) for the error of a call that differs. Holds
    none of the caller's objects or arrays."""

    __slots__ = ("info", "key", "num_args", "num_bound", "record", "source")

    def __init__(self, source: StageSource, call: JitCall, info: JitRecord):
        self.source, self.key, self.info = source, call.key, info
        self.num_args = len(call.args)
        self.num_bound = 0 if source.bound is None else len(source.bound.args)
        self.record = _retrace.record_of(call.key, call.leaves, _layout(call, source.shape.naming))

    def native_call(self, stage: Any) -> _native.StageCall:
        """The call of ``stage`` (``rust/call/stage.rs``): the jitted call with ``stage``
        computing, for the dynamic arguments (the static ones were fixed when the stage was
        made, as under jax.jit); the calls it does not take go to :meth:`refuse`."""
        source, statics = self.source, self.key[1]
        fixed: list[tuple[int, Any]] = []
        names: dict[str, Any] = {}
        if statics is not None:
            _, positional, keyword = statics
            fixed = sorted(((i, v) for i, _, v in positional), key=operator.itemgetter(0))
            names = {k: v for k, _, v in keyword}
        bound = None
        if source.bound is not None:
            bound = (source.bound.args, source.bound, source.partial)
        return _native.StageCall(
            source.lean,
            (stage, self.key, self.key[4] is not None),  # keyed by the arguments' placements?
            (source.policy, source.own_policy, policy_override.get),
            (fixed, names),
            functools.partial(self.refuse, stage),
            bound,
        )

    def refuse(self, stage: Any, args: tuple, kwargs: dict | None) -> NoReturn:
        """The error of a call of ``stage`` that its native call does not take: another
        policy, a static argument given, arguments that cannot be flattened or that differ
        from those the stage was made for."""
        source = self.source
        source.check_policy()
        if source.bound is not None:
            args = (*source.bound.args, *args)
        args, kwargs = self._with_statics(args, kwargs or {})
        raise TypeError(self._mismatch(source.prepare(args, kwargs)))

    def _with_statics(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call's arguments with the static ones the stage was made for put back."""
        statics = self.key[1]
        if statics is None:
            return args, kwargs
        _, positional, keyword = statics
        for k, *_ in keyword:
            if k in kwargs:
                raise TypeError(
                    see(
                        "aot-stage",
                        f"{fun_name(self.source.fun)}: the static argument {k!r} was fixed when "
                        "the stage was made; call it with the other arguments only (as jax.jit's)",
                    )
                )
        fixed = {i: v for i, _, v in positional}
        given, full = list(args), list[Any]()
        while given or len(full) in fixed:  # (fewer arguments: the key differs, said then)
            full.append(fixed[len(full)] if len(full) in fixed else given.pop(0))
        return tuple(full), {**kwargs, **{k: v for k, _, v in keyword}}

    def _mismatch(self, call: JitCall) -> str:
        """What differs between the call the stage was made for and ``call``."""
        naming = self.source.shape.naming
        new = _retrace.record_of(call.key, call.leaves, _layout(call, naming))
        changes = _retrace.call_differences(self.record, new, naming.name)
        old_static, new_static = self.key[3], call.key[3]
        if self.key[0] == call.key[0] and old_static != new_static:
            before = {} if old_static is None else {s: v for s, _, v in old_static.entries}
            after = {} if new_static is None else {s: v for s, _, v in new_static.entries}
            changes += [
                (new.slot_paths[s], f"static leaf changed from {before.get(s)!r} to {v!r}")
                for s, v in after.items()
                if s not in before or not _effects.same_data(before[s], v)
            ]
        lines = [
            f"{fun_name(self.source.fun)} was traced, lowered and compiled ahead of time for "
            "arguments that differ from these (their structure, sharing, static values and "
            "static leaves are part of the compiled code, as the structure is under jax.jit):"
        ]
        if not changes:
            changes = [("", _retrace.structure_difference(self.record, new))]
        lines += [f"  * {p}: {text}" if p else f"  * {text}" for p, text in changes]
        lines.append(
            "Lower and compile again for these arguments, or call the jitted function itself "
            "(it traces and compiles for new arguments as needed)."
        )
        if self.key[1] is not None:
            lines.append(
                "A stage takes the arguments that are not static (static_argnums, "
                "static_argnames), as jax.jit's stages do."
            )
        return "\n".join(lines)

    def slots(self, stage: Any, of: str = "args_info") -> list:
        """Per distinct leaf: the stage's ``ArgInfo`` (``of="in_avals"``: its aval), the
        static leaves as they are."""
        (donated, *kept), _ = getattr(stage, of)
        donation, static = self.key[2], self.key[3]
        return from_jit_order(kept, donated, None if donation is None else donation.keep, static)

    def args_info(self, stage: Any, of: str = "args_info") -> Any:
        """``(args, kwargs)`` of the dynamic arguments (those after the bound ones), each leaf
        its ``ArgInfo`` (``of="in_avals"``: its aval), a static leaf as it is."""
        root = self.key[0].unflatten(self.slots(stage, of))
        return tuple(root[self.num_bound : self.num_args]), root[self.num_args]

    def out_info(self, stage: Any, of: str = "out_info", inputs: str = "in_avals") -> Any:
        """The function's result, each array a ``jax.ShapeDtypeStruct`` (None: not worked out
        for this result); ``of="output_shardings"`` (and ``inputs="input_shardings"``): each
        its sharding, and the same for the formats."""
        info = self.info
        if info.out_sources is None:
            return None
        shapes = of == "out_info"
        outputs = [_as_shape(x) if shapes else x for x in getattr(stage, of).leaves]
        for i, value in info.static_outputs:
            outputs[i] = value if shapes else None
        ins = self.slots(stage, inputs)
        formats: list | None = None
        if shapes and _jax_compat.COMPILED_OUT_INFO_HAS_FORMATS and hasattr(stage, "input_formats"):
            formats = self.slots(stage, "input_formats")
        static = () if self.key[3] is None else self.key[3].slots
        for s, x in enumerate(ins):
            if s in static:  # (a static leaf is returned as it is)
                ins[s] = x if shapes else None
            elif shapes:
                sharding = None if formats is None else formats[s]
                ins[s] = jax.ShapeDtypeStruct(
                    x.shape, x.dtype, sharding=sharding, weak_type=x.weak_type
                )
        result = [(outputs if kind == "out" else ins)[i] for kind, i in info.out_sources]
        return jax.tree_util.tree_unflatten(info.out_tree, result)


def _as_shape(x: Any) -> Any:
    """An output's description as a ``jax.ShapeDtypeStruct`` (JAX before 0.7 describes a
    traced stage's outputs with its own ``OutInfo``); None (a static output's place) as it
    is."""
    if x is None or isinstance(x, jax.ShapeDtypeStruct):
        return x
    weak_type = getattr(x, "weak_type", False)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=weak_type)


class _Stage:
    """What every stage has: the user's view of its arguments and result (``args_info``,
    ``in_tree``, ``in_avals``, ``donate_argnums``, ``out_tree``, ``out_info``,
    ``input_shardings``, ``output_shardings`` and the formats, in the user's structures);
    everything else ``jax.stages`` defines (``as_text``, ``cost_analysis``, ``compiler_ir``,
    ``memory_analysis``, ``jaxpr``, ``runtime_executable``, ...) is the stage of the inner
    ``jax.jit``'s, passed through (:func:`_pass_through`).

    Each stage class is also a subclass of ``jax.stages``' own (``Traced``, ``Lowered``,
    ``Compiled``), so ``isinstance`` and annotated type checks (equinox's, jaxtyping's) hold.
    The base's ``__init__`` is not run: its attributes (slots such as ``_lowering`` or
    ``_executable``) stay unset, every public name is defined here, and a private one read by
    code outside (unset here, an AttributeError) is the inner stage's (``__getattr__``)."""

    __slots__ = ()
    _made: StagedCall
    _stage: Any

    def __init__(self, made: StagedCall, stage: Any):
        self._hold(made, stage)

    def _hold(self, made: StagedCall, stage: Any) -> None:
        # (The slots are the concrete classes': two bases with slots of their own cannot be
        # combined, and jax's classes have theirs.)
        object.__setattr__(self, "_made", made)
        object.__setattr__(self, "_stage", stage)

    @property
    def args_info(self) -> Any:
        """The arguments' ``jax.stages.ArgInfo`` (shape, dtype, donated), in their structure."""
        return self._made.args_info(self._stage)

    @property
    def in_tree(self) -> Any:
        """The structure of ``(args, kwargs)``, the static arguments left out."""
        return jax.tree_util.tree_structure(self.args_info)

    @property
    def in_avals(self) -> Any:
        """The arguments' avals, in their structure."""
        return self._made.args_info(self._stage, "in_avals")

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        """The donated leaves' indices among ``in_tree``'s leaves."""
        leaves = jax.tree_util.tree_leaves(self.args_info)
        return tuple(i for i, x in enumerate(leaves) if getattr(x, "donated", False))

    @property
    def out_tree(self) -> Any:
        """The structure of the function's result."""
        return self._made.info.out_tree

    @property
    def out_info(self) -> Any:
        """The function's result as ``jax.ShapeDtypeStruct``s (``jitted.eval_shape``'s)."""
        return self._made.out_info(self._stage)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_made", "_stage", "_call"):  # not set yet (a copy)
            raise AttributeError(name)
        return getattr(self._stage, name)

    def __getstate__(self) -> tuple[StagedCall, Any]:
        # (The default would also read the base's slots, ``args_info`` among them: properties
        # here, which a copy could not set.)
        return self._made, self._stage

    def __setstate__(self, state: tuple[StagedCall, Any]) -> None:
        self._hold(*state)

    def __repr__(self) -> str:
        return f"<treeclone {type(self).__name__} of {fun_name(self._made.source.fun)}>"


def _pass_through(cls: type, base: type) -> type:
    """Define on ``cls`` every public attribute of ``base`` (a ``jax.stages`` class, of the
    installed release) that ``cls`` does not: a method calls the inner stage's, a property or
    attribute reads it. So ``dir()`` lists what ``jax.stages`` documents, and no method of
    ``base`` runs on a stage whose base attributes are unset."""
    own = set().union(*(vars(k) for k in cls.__mro__[: cls.__mro__.index(base)]))
    for name in dir(base):
        if name.startswith("_") or name in own:
            continue
        raw = inspect.getattr_static(base, name)
        if isinstance(raw, (staticmethod, classmethod)):  # (``Compiled.call``: jax's own)
            continue
        if inspect.isfunction(raw):
            setattr(cls, name, _forwarding_method(cls, name, raw))
        else:
            doc = getattr(raw, "__doc__", None) if isinstance(raw, property) else None
            setattr(cls, name, property(operator.attrgetter(f"_stage.{name}"), doc=doc))
    return cls


def _forwarding_method(cls: type, name: str, raw: Callable) -> Callable:
    """``cls.name``: the inner stage's method ``name`` (``raw``, whose signature and doc it
    shows)."""

    def method(self: _Stage, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._stage, name)(*args, **kwargs)

    functools.update_wrapper(method, raw)
    method.__qualname__ = f"{cls.__name__}.{name}"
    return method


class _CalledStage(_Stage):
    """A stage that can be called: its call is the jitted call with this stage computing,
    natively (:meth:`StagedCall.native_call`), kept in the slot ``_call``."""

    __slots__ = ()

    def _hold(self, made: StagedCall, stage: Any) -> None:
        super()._hold(made, stage)
        object.__setattr__(self, "_call", made.native_call(stage))

    # Read from the slot in C (``operator.attrgetter``), then called: no Python frame runs.
    __call__: Any = property(operator.attrgetter("_call"))


class Traced(_CalledStage, jax.stages.Traced):
    """``jitted.trace(...)``: :meth:`lower` it; called, it evaluates the trace as the jitted
    call (write-back included), as ``jax.stages.Traced``'s call evaluates its jaxpr."""

    __slots__ = ("_call", "_made", "_stage")

    @property
    def fun_name(self) -> str:
        """The traced function's name (the inner stage's)."""
        return self._stage.fun_name

    @property
    def jaxpr(self) -> Any:
        """The inner computation's jaxpr (its parameters: the donated leaves, then the
        others)."""
        return self._stage.jaxpr

    def lower(self, **kwargs: Any) -> Lowered:
        return Lowered(self._made, self._stage.lower(**kwargs))


# jax's ``Lowered`` and ``Compiled`` hold ``out_tree`` in a slot; here it is read from the call
# the stage was made for (the user's structure).
class Lowered(_Stage, jax.stages.Lowered):  # type: ignore[override]
    """``jitted.lower(...)``: :meth:`compile` it."""

    __slots__ = ("_made", "_stage")

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        return Compiled(self._made, self._stage.compile(*args, **kwargs))


class Compiled(_CalledStage, jax.stages.Compiled):  # type: ignore[override]
    """``jitted.lower(...).compile()``: called, it is the jitted call (write-back, strict's
    checks, static leaves, identity) running this executable."""

    __slots__ = ("_call", "_made", "_stage")

    @property
    def input_shardings(self) -> Any:
        """Each argument leaf's sharding, in the arguments' structure (as ``args_info``)."""
        return self._made.args_info(self._stage, "input_shardings")

    @property
    def input_formats(self) -> Any:
        """Each argument leaf's format, in the arguments' structure."""
        return self._made.args_info(self._stage, "input_formats")

    @property
    def output_shardings(self) -> Any:
        """Each result leaf's sharding, in the result's structure (a result that is an
        argument: its input sharding)."""
        return self._made.out_info(self._stage, "output_shardings", "input_shardings")

    @property
    def output_formats(self) -> Any:
        """Each result leaf's format, in the result's structure."""
        return self._made.out_info(self._stage, "output_formats", "input_formats")


_pass_through(Traced, jax.stages.Traced)
_pass_through(Lowered, jax.stages.Lowered)
_pass_through(Compiled, jax.stages.Compiled)
