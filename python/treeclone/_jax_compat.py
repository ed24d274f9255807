"""Everything treeclone reads from JAX's internals lives here, for JAX 0.6.2 and later (but
the flatten functions the core runs natively, recognised in ``_known_flatten``).

Below ``MIN_JAX`` the import fails with a clear ImportError. Above it no release is refused:
what differs between releases is probed by feature (``hasattr``, or a call whose behaviour
changed), never by version number: one commented place per difference, each headed "JAX
difference N". A probe that finds nothing on a release this project has not seen fails with
:class:`UnsupportedJaxError` naming the JAX attribute it missed and the installed version: at
import for what every call needs (the registry), at the first call that needs it otherwise
(:func:`internal`), never as a bare AttributeError deep inside a call.

JAX keeps the Python-side flatten/unflatten functions of every registered node type in
``jax._src.tree_util._registry`` (a dict that only grows). The Rust core classifies an unknown
type by calling :func:`classify_type` once and caches the answer; it notices registrations made
later, through any of JAX's public functions, because the size of that dict changes.
"""

from __future__ import annotations

import importlib
from typing import Any

import jax
from jax.core import Tracer
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey, keystr

from treeclone._docs import see
from treeclone._known_flatten import custom_kind as _custom_kind
from treeclone._known_flatten import dataclass_fields as _dataclass_fields
from treeclone._known_flatten import equinox_flatten as _equinox_flatten
from treeclone._native import TypeKind

# The oldest JAX release treeclone supports and is tested against (pyproject.toml declares
# jax>=0.6.2 with no upper bound; .ci/run tests the oldest and newest releases it can install,
# see tests/compat_subset.txt). Below it: ImportError. Everything that differs between releases
# is probed by feature below, one place per difference, each marked "JAX difference".
MIN_JAX = (0, 6, 2)


class UnsupportedJaxError(ImportError):
    """The installed JAX lacks an internal that treeclone reads (a release it has not seen)."""


def _unsupported(what: str, exc: BaseException) -> UnsupportedJaxError:
    return UnsupportedJaxError(
        see(
            "unsupported-jax",
            f"treeclone needs {what}, which jax {jax.__version__} does not have ({exc}). "
            "treeclone is tested with jax 0.6.2 to 0.10.2 (and 0.11.2 once, see the README); "
            "please report this with your JAX version.",
        )
    )


try:
    import jax._src.tree_util as _jtu
except ImportError as _exc:  # a JAX that moved its pytree module: nothing can work
    raise _unsupported("jax._src.tree_util", _exc) from None


class _Missing:
    """Stands for a JAX internal this release lacks: any use raises the error naming it."""

    def __init__(self, what: str, exc: BaseException):
        self._error = _unsupported(what, exc)

    def __call__(self, *args: Any, **kwargs: Any):
        raise self._error

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and introspection probes: not a use
            raise AttributeError(name)
        raise self._error

    def __bool__(self) -> bool:
        return False


def internal(module: str, name: str) -> Any:
    """``module.name`` from JAX, or a stand-in whose first use raises :class:`UnsupportedJaxError`
    naming ``module.name`` and the installed JAX version. ``bool(stand_in)`` is False, so a
    caller with a fallback can test for it without using it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        return _Missing(f"{module}.{name}", exc)


def require(obj: Any) -> Any:
    """``obj`` itself, or, for a stand-in of :func:`internal`, its error raised now."""
    if isinstance(obj, _Missing):
        obj()
    return obj


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version_tuple(jax.__version__) < MIN_JAX:
    raise ImportError(
        f"treeclone needs jax>={'.'.join(map(str, MIN_JAX))}, found jax {jax.__version__}"
    )

# What every call needs: without it nothing works, so the import fails, naming it.
registry: dict = require(internal("jax._src.tree_util", "_registry"))
default_registry = require(internal("jax._src.tree_util", "default_registry"))
_PyTreeDef = type(jax.tree_util.tree_structure(0))

flatten_one_level_with_keys = default_registry.flatten_one_level_with_keys


# --- JAX difference 1: building one jaxlib treedef node from node data and children ----------
# jax >= 0.8: ``PyTreeDef.from_node_data_and_children(registry, node_data, children)``.
# jax 0.6, 0.7: no such function (under any name); a treedef is built from its pickle state
# instead (``__getstate__``/``__setstate__``, present on every supported release): the registry
# and a post-order list of ``(kind, arity, data, type, num_leaves, num_nodes)``, ``kind`` being
# jaxlib's ``PyTreeKind`` number (read off sample treedefs below, not written down).
if hasattr(_PyTreeDef, "from_node_data_and_children"):
    _from_node_data_and_children = _PyTreeDef.from_node_data_and_children
else:

    def _kind_number(treedef) -> int:
        return treedef.__getstate__()[1][-1][0]

    def _probe_kinds() -> dict:
        from collections import namedtuple
        from dataclasses import dataclass

        from jax._src.lib import pytree

        @dataclass
        class _Data:
            a: int

        class _Node:
            pass

        # A private registry: the probe registers nothing where users could see it.
        probe = pytree.PyTreeRegistry()
        probe.register_node(_Node, lambda n: ((), None), lambda aux, children: _Node())
        probe.register_dataclass_node(_Data, ["a"], [])
        samples = {
            "leaf": 0,
            "none": None,
            "tuple": (),
            "list": [],
            "dict": {},
            "namedtuple": namedtuple("_Pair", "a b")(1, 2),
            "custom": _Node(),
            "dataclass": _Data(1),
        }
        return {name: _kind_number(probe.flatten(x)[1]) for name, x in samples.items()}

    _KIND = _probe_kinds()
    _BUILTIN_KIND = {tuple: _KIND["tuple"], list: _KIND["list"], dict: _KIND["dict"]}
    _BUILTIN_KIND[type(None)] = _KIND["none"]

    def _registered_as_dataclass(ty: type) -> bool:
        # A type registered through ``jax.tree_util.register_dataclass`` is a "dataclass" node
        # to jaxlib, any other registered type a "custom" one; the type alone does not say
        # which (nor does jaxlib's registry, on these releases), but the unflatten function
        # that register_dataclass puts in ``_registry`` does.
        entry = registry.get(ty)
        fn = getattr(entry, "from_iter", None)
        return (
            getattr(fn, "__module__", None) == _jtu.__name__
            and getattr(fn, "__qualname__", "") == "register_dataclass.<locals>.unflatten_func"
        )

    def _from_node_data_and_children(registry_, node_data, children):
        nodes: list = []
        num_leaves, num_nodes = 0, 1
        for child in children:
            child_nodes = child.__getstate__()[1]
            nodes.extend(child_nodes)
            num_leaves += child.num_leaves
            num_nodes += child.num_nodes
        arity = len(children)
        if node_data is None:
            if arity:
                raise ValueError("a leaf has no children")
            nodes.append((_KIND["leaf"], 0, None, None, 1, 1))
        else:
            ty, data = node_data
            if ty in _BUILTIN_KIND:
                # dict: the (sorted) keys; tuple, list, None: no data.
                data = data if ty is dict else None
                nodes.append((_BUILTIN_KIND[ty], arity, data, None, num_leaves, num_nodes))
            elif ty not in registry and issubclass(ty, tuple) and hasattr(ty, "_fields"):
                nodes.append((_KIND["namedtuple"], arity, ty, None, num_leaves, num_nodes))
            else:
                kind = _KIND["dataclass" if _registered_as_dataclass(ty) else "custom"]
                nodes.append((kind, arity, data, ty, num_leaves, num_nodes))
        treedef = _PyTreeDef.__new__(_PyTreeDef)
        treedef.__setstate__((registry_, nodes))
        return treedef


# --- JAX difference 2: is a type a node of jaxlib's registry? --------------------------------
# jax >= 0.10: ``PyTreeRegistry.is_node(type)``. jax 0.6 to 0.9: no such query (nor
# ``jax.tree_util.is_tree_node``). There every registration function of jax.tree_util fills
# ``_registry`` too (checked on 0.6.2, 0.7.2, 0.8.3, 0.9.2, and JAX itself registers nothing
# in default_registry alone), so a type missing from ``_registry`` is a node only if someone
# called ``default_registry.register_node`` directly: such a type is a leaf to treeclone there.
if hasattr(default_registry, "is_node"):
    _is_registry_only_node = default_registry.is_node
else:

    def _is_registry_only_node(ty: type) -> bool:
        return False


# --- JAX difference 3: the output treedef of ``jax.jit(f).trace(...)`` -------------------------
# jax >= 0.8: ``Traced.out_tree``. jax 0.6, 0.7: only the private ``_out_tree``; the public
# ``out_info`` (the outputs' shapes, in the output's structure) gives the same treedef.
def traced_out_tree(traced):
    """The treedef of the outputs of a ``jax.stages.Traced``."""
    out_tree = getattr(traced, "out_tree", None)
    if out_tree is None:
        out_tree = jax.tree_util.tree_structure(traced.out_info)
    return out_tree


# --- JAX difference 4: naming a jitted function's arguments in jax's messages -----------------
# jax >= 0.7 reads a function's ``__fun_debug_info__``: a ``jax._src.core.DebugInfo`` whose
# result paths start as ``initial_result_paths``. jax 0.6 has neither the hook nor that value
# (it names the arguments itself): DebugInfo is None there, and treeclone.jit leaves the naming
# to jax. Private names, hence also None on a release that moved them.
try:
    from jax._src.api_util import fun_sourceinfo
    from jax._src.core import DebugInfo
    from jax._src.core import initial_result_paths as INITIAL_RESULT_PATHS
except ImportError:
    fun_sourceinfo = None  # type: ignore[assignment]
    DebugInfo = None  # type: ignore[assignment,misc]
    INITIAL_RESULT_PATHS = None


# --- Internals the lifted transformations read -------------------------------------------------
# vmap under alias/strict must know whether a value is batched by the current vmap: JAX has no
# public way to ask, so it reads the tracer type and the current trace (vmap/).
BatchTracer = internal("jax._src.interpreters.batching", "BatchTracer")
trace_ctx = internal("jax._src.core", "trace_ctx")
# Rule J31's write-back check runs only inside a JAX transformation: the native CallPlan reads
# ``trace_ctx.trace`` and compares its type with the top level's (rust/registry/compat.rs);
# without these it looks at the values instead.
EvalTrace = internal("jax._src.core", "EvalTrace")
# vmap's in_axes broadcast to the arguments' leaves, with JAX's own errors.
flatten_axes = internal("jax.api_util", "flatten_axes") or internal(
    "jax._src.api_util", "flatten_axes"
)
# Retracing explanations (_retrace) read JAX's own switch as JAX does (a context-aware state).
explain_cache_misses = internal("jax._src.config", "explain_cache_misses")


def exclude_from_user_frames(path: str) -> None:
    """Have JAX treat the files under ``path`` as its own when it looks for the user's frame:
    a tracing-cache miss is then reported at the user's call (``TRACING CACHE MISS at
    step.py:12``), not at treeclone's call of the inner ``jax.jit``, and JAX's hint that a
    function "re-defined on the same line" is not made for every function treeclone jits.
    A JAX without the hook keeps naming treeclone's line; nothing else changes."""
    register = internal("jax._src.source_info_util", "register_exclusion")
    if register:
        register(path)


def _opaque_functions(ty: type):
    """Flatten/unflatten for a type registered only in jaxlib's C++ registry."""

    def flatten(obj):
        return default_registry.flatten_one_level(obj)

    def unflatten(aux, children):
        children = tuple(children)
        leaf = jax.tree_util.tree_structure(0)
        treedef = _from_node_data_and_children(default_registry, (ty, aux), [leaf] * len(children))
        return treedef.unflatten(children)

    return flatten, unflatten


def classify_type(ty: type):
    """``(TypeKind, flatten, unflatten)`` for a type that is not list, tuple, dict or None;
    for a type registered by ``register_dataclass``, ``(TypeKind.Dataclass, flatten, unflatten,
    (data_fields, meta_fields))``; an equinox Module's, ``TypeKind.EqxModule``
    (``_known_flatten.equinox_flatten``)."""
    entry = registry.get(ty)
    if entry is not None:
        fields = _dataclass_fields(entry.to_iter)
        if fields is not None:
            return TypeKind.Dataclass, entry.to_iter, entry.from_iter, fields
        kind = _custom_kind(entry.to_iter)
        if kind is TypeKind.Custom and _equinox_flatten(ty, entry.to_iter):
            kind = TypeKind.EqxModule
        return kind, entry.to_iter, entry.from_iter
    if issubclass(ty, tuple) and hasattr(ty, "_fields"):
        return TypeKind.NamedTuple, None, None
    if _is_registry_only_node(ty):
        return (TypeKind.Custom, *_opaque_functions(ty))
    return TypeKind.Leaf, None, None


def unflatten_node(ty: type, aux, children):
    """One node of a registered type ``ty`` built from its aux data and children."""
    entry = registry.get(ty)
    if entry is not None:
        return entry.from_iter(aux, children)
    return _opaque_functions(ty)[1](aux, children)


def to_jax_node(node_data, children):
    """Build one jaxlib PyTreeDef node from JAX-style node data and child treedefs."""
    return _from_node_data_and_children(default_registry, node_data, children)


__all__ = [
    "INITIAL_RESULT_PATHS",
    "BatchTracer",
    "DebugInfo",
    "DictKey",
    "FlattenedIndexKey",
    "GetAttrKey",
    "SequenceKey",
    "UNSPECIFIED",
    "UnsupportedJaxError",
    "classify_type",
    "exclude_from_user_frames",
    "explain_cache_misses",
    "flatten_axes",
    "flatten_one_level_with_keys",
    "internal",
    "is_unspecified",
    "keystr",
    "prefix_errors",
    "registry",
    "require",
    "to_jax_node",
    "trace_ctx",
    "trace_of",
    "Tracer",
    "EvalTrace",
    "current_trace",
    "stages_constants",
    "traced_out_tree",
    "unflatten_node",
]


# --- JAX difference 5: tree_map's error when a later tree does not match the first ----------
# jax >= 0.10 reports it as a prefix error ("pytree structure error: ... at key path ...",
# from ``_prefix_error``); jax 0.6 to 0.9 let jaxlib's ``flatten_up_to`` error through as it
# is (whose text changed too: a dict's key mismatch shows the dict on 0.6, its keys on 0.7 on).
# Probed on a mismatch: does jax's tree_map say what flatten_up_to says?
def _tree_map_reports_prefix_errors() -> bool:
    tree, other = [0], (0,)
    try:
        jax.tree_util.tree_structure(tree).flatten_up_to(other)
    except ValueError as exc:
        raw = str(exc)
    try:
        jax.tree_util.tree_map(lambda *xs: None, tree, other)
    except ValueError as exc:
        return str(exc) != raw
    return True  # pragma: no cover - a mismatch always raises


_TREE_MAP_PREFIX_ERRORS = _tree_map_reports_prefix_errors()
# JAX's builder of prefix-error messages (private on every release; the texts are JAX's).
_prefix_error = internal("jax._src.tree_util", "_prefix_error")


def prefix_error(tree, other, is_leaf, exc, name):
    """The exception JAX's tree_map raises when `other` does not match `tree`'s structure."""
    if not _TREE_MAP_PREFIX_ERRORS:
        # jaxlib's own flatten_up_to error, so that the text is the installed JAX's.
        try:
            jax.tree_util.tree_structure(tree, is_leaf).flatten_up_to(other)
        except (RecursionError, SystemError):
            return exc  # jaxlib recurses into a cyclic tree: keep treeclone's error
        except Exception as raw:  # noqa: BLE001 - whatever jaxlib raises is JAX's answer
            return raw
        return exc
    try:
        err = next(_prefix_error((), tree, other, is_leaf), None)
    except (RecursionError, SystemError):
        return exc  # JAX's message builder recurses into a cyclic tree: keep treeclone's error
    return err(name) if err is not None else exc


def prefix_errors(prefix_tree, full_tree, is_leaf=None):
    """JAX's message builders for each place where ``prefix_tree`` is not a prefix of
    ``full_tree`` (``jax._src.tree_util.prefix_errors``): ``[fn(name) -> ValueError, ...]``."""
    return list(_prefix_error((), prefix_tree, full_tree, is_leaf))


# --- JAX difference 6: tree_reduce's "no initializer" (and reduce_associative's "no identity") --
# jax >= 0.8: an ``Unspecified()`` instance. jax 0.7: tree_reduce's default is still the
# ``no_initializer`` object while tree_reduce_associative (new in 0.7) has ``Unspecified()``.
# jax 0.6: ``no_initializer`` only. A caller who passes JAX's own sentinel to treeclone gets
# what JAX would do with it: either sentinel, where the release has it, means "not given".
_Unspecified = getattr(_jtu, "Unspecified", None)
_NO_INITIALIZER = getattr(_jtu, "no_initializer", None)
UNSPECIFIED: Any = _Unspecified() if _Unspecified is not None else _NO_INITIALIZER


def is_unspecified(x) -> bool:
    """Whether ``x`` is JAX's "argument not given" sentinel of tree_reduce."""
    if _Unspecified is not None and isinstance(x, _Unspecified):
        return True
    return _NO_INITIALIZER is not None and x is _NO_INITIALIZER


# --- JAX difference 7: JAX Refs (mutable array references) ---------------------------------
# jax >= 0.7: ``jax.ref.Ref`` / ``jax.new_ref``; jax 0.6: ``jax.experimental.mutable_array``.
# Every release has ``jax._src.state.types.AbstractRef``, the abstract value of a Ref, concrete
# or traced (a tracer's ``aval``; a concrete Ref has one too): a Ref is told by it. A release
# without it has no Refs to tell.
_AbstractRef = internal("jax._src.state.types", "AbstractRef")


def is_ref(x: Any) -> bool:
    """Whether ``x`` is a JAX Ref (``jax.new_ref``), concrete or traced: a mutable array that
    JAX passes into a transformed function but never returns from one."""
    if not _AbstractRef:
        return False
    try:
        return isinstance(x.aval, _AbstractRef)
    except AttributeError:
        return False


# --- JAX difference 8: the ahead-of-time stages' classes ------------------------------------
# treeclone's stages subclass ``jax.stages.Traced``, ``Lowered`` and ``Compiled`` and define
# every public name the installed release's classes have (``_jit.stages``), which differ:
# ``Traced`` holds ``jaxpr``/``fun_name`` in slots on 0.6, reads them from its parameters on
# 0.7 and later (and has ``out_avals``, ``lojax`` on 0.10); ``Compiled.out_info`` exists from
# 0.7 on, each output a ``ShapeDtypeStruct`` whose sharding is its ``Format`` (a result that is
# an argument, put back by treeclone, is given its argument's input format, as jax's stage
# would give it).
COMPILED_OUT_INFO_HAS_FORMATS = "out_info" in vars(jax.stages.Compiled)


# --- Which JAX transformation a tracer belongs to (for messages) ----------------------------
# A staging tracer (jit, scan, cond, checkify, ...) has ``_debug_info.traced_for``, JAX's own
# name for what traced it; vmap's and the autodiff tracers are told by their type. Whether its
# transformation has returned: its trace is not on the current stack, which every supported
# release links from ``trace_ctx.trace`` through each trace's ``parent_trace`` down to the
# ``EvalTrace`` (a jaxpr trace is never invalidated, so ``is_valid()`` cannot tell). Private:
# a stack that cannot be followed to its end, or a name missing, tells nothing (None).
_TRACED_BY_TYPE = {
    "BatchTracer": "vmap",
    "JVPTracer": "grad",
    "LinearizeTracer": "grad",
}


def traced_by(tracer: Any) -> str | None:
    """JAX's name of the transformation ``tracer`` belongs to (``"scan"``, ``"cond"``,
    ``"jit"``, ``"vmap"``, ``"grad"``, ``"checkify"``, ...), or None when it cannot be told."""
    by_type = _TRACED_BY_TYPE.get(type(tracer).__name__)
    if by_type is not None:
        return by_type
    traced_for = getattr(getattr(tracer, "_debug_info", None), "traced_for", None)
    return traced_for if isinstance(traced_for, str) else None


def live_traces() -> set[int] | None:
    """The ids of the traces on the current stack (the innermost transformation's down to the
    top level), or None when the stack cannot be followed to its end."""
    if not trace_ctx:
        return None
    trace = trace_ctx.trace
    live: set[int] = set()
    while trace is not None and id(trace) not in live:
        live.add(id(trace))
        if type(trace).__name__ == "EvalTrace":
            return live
        trace = getattr(trace, "parent_trace", None)
    return None


def current_trace() -> Any:
    """The trace of the innermost JAX transformation running now in this thread (the
    top-level ``EvalTrace`` outside any), or None when it cannot be read."""
    return trace_ctx.trace if trace_ctx else None


def trace_of(tracer: Any) -> Any:
    """The trace ``tracer`` belongs to, or None when it cannot be read."""
    return getattr(tracer, "_trace", None)


def stages_constants(trace: Any) -> bool:
    """Whether a value made from constants under ``trace`` is one of its tracers (a jaxpr
    trace: ``jit``, ``scan``, ``cond``, ``checkpoint``, ...), as opposed to a concrete array
    (``grad``'s and ``vmap``'s traces wrap only what depends on their inputs). True when it
    cannot be told."""
    name = type(trace).__name__
    return name not in ("JVPTrace", "LinearizeTrace", "BatchTrace")


def first_escaped(leaves: Any) -> Any:
    """The first of ``leaves`` that is a tracer of a JAX transformation that has returned (what
    JAX's ``UnexpectedTracerError`` is about), or None."""
    live = None
    for x in leaves:
        if isinstance(x, jax.core.Tracer):
            if live is None:
                live = live_traces()
                if live is None:
                    return None
            trace = getattr(x, "_trace", None)
            if trace is not None and id(trace) not in live:
                return x
    return None


# --- JAX difference 9: explicit mesh axes and ``reshard`` -----------------------------------
# Every supported release has ``jax.sharding.AxisType`` (Auto, Explicit, Manual) and a mesh's
# ``axis_types``; jax.make_mesh makes Explicit axes by default from 0.8 on (Auto before).
# ``with_sharding_constraint`` takes only Auto axes (and under ``jax.set_mesh`` of an all-
# Explicit mesh only asserts); an Explicit axis is placed by ``reshard``: ``jax.sharding.
# reshard`` on jax >= 0.7, ``jax.experimental.shard.reshard`` on jax 0.6.
_AxisType = getattr(jax.sharding, "AxisType", None)
reshard: Any = getattr(jax.sharding, "reshard", None) or internal(
    "jax.experimental.shard", "reshard"
)


def explicit_axes(mesh: Any) -> frozenset:
    """The names of ``mesh``'s Explicit axes (none on a mesh without axis types)."""
    types = getattr(mesh, "axis_types", None)
    if _AxisType is None or not types:
        return frozenset()
    return frozenset(
        n for n, t in zip(mesh.axis_names, types, strict=False) if t == _AxisType.Explicit
    )


# --- JAX difference 10: a sharding's check against an array's shape --------------------------
# jax 0.10 checks that a sharding fits an array's rank with ``Sharding.check_compatible_aval``
# (jax.jit's "is incompatible with its sharding annotation"); 0.6 and 0.7 have no such public
# method, and their jax.jit's own check differs: there only ``shard_shape``'s is made.
def check_compatible_aval(sharding: Any, shape: tuple) -> None:
    """``sharding.check_compatible_aval(shape)`` where this JAX has it (its ValueError)."""
    check = getattr(sharding, "check_compatible_aval", None)
    if check is not None:
        check(shape)
