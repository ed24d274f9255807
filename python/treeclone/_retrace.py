"""Why a function under ``alias`` or ``strict`` traced again, in the user's words.

Under those policies ``treeclone.jit`` (and ``jit_partial``) hands JAX one boxed list of
distinct leaves whose static data is the arguments' structure: a structure change is a new
JAX cache entry, and JAX's own explanation of it can only say that the box has another number
of children. Each trace of the inner function (``_jit.inner.Inner.__call__``) therefore records
the arguments as the user sees them, one descriptor per key path (``state['hist']``: a list of 3;
``batch['x']``: ``f32[8,2]``), and compares a new trace with the earlier ones of the same
function and policy:

- with JAX's ``jax_explain_cache_misses`` on, the differences from the closest earlier trace
  are logged on the logger and at the level JAX logs its own tracing-cache misses;
- a function whose last ``RETRACE_STREAK`` traces each followed from the previous call's
  write-back (the structure the call left in the caller's arguments is the next call's new
  structure: a list that grows by one each call) gets one :class:`RetraceWarning`.

Everything here runs at trace time only: a call that hits JAX's cache costs nothing more.
See docs/semantics.md, "Retracing".
"""

from __future__ import annotations

import collections
import logging
import os
import reprlib
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax

from treeclone import _jax_compat, _native
from treeclone._docs import see
from treeclone._effects import Layout, Paths, holds_tracer, same_data
from treeclone._native import EntryInfo

# Traces in a row, each following from the previous call's write-back, that make the warning.
RETRACE_STREAK = 5
# Earlier traces kept per function and policy, to find the closest one to a new trace.
_HISTORY = 8

# JAX logs its tracing-cache misses on this logger, at WARNING when the flag is on: treeclone's
# explanations go to the same place, so whoever captures JAX's sees these next to them.
_JAX_LOGGER = "jax._src.interpreters.partial_eval"
logger = logging.getLogger(_JAX_LOGGER)

# JAX reads the flag as ``config.explain_cache_misses.value`` (a context-aware state); the
# public ``jax.config`` attribute is the fallback on a release that moved it.
_flag = _jax_compat.explain_cache_misses


def explaining() -> bool:
    """Whether JAX's ``jax_explain_cache_misses`` is on (as JAX itself reads it)."""
    try:
        return bool(_flag.value)
    except _jax_compat.UnsupportedJaxError:
        return bool(getattr(jax.config, "jax_explain_cache_misses", False))


class RetraceWarning(UserWarning):
    """A jitted function traced (and compiled) again on each of its last calls because each
    call's write-back changed the structure of its own arguments (a list in the state that
    grows by one each call). Issued once per function and policy; keep the structure fixed
    (preallocate an array instead of appending to a list), or keep what grows out of the
    step's arguments.

    >>> import treeclone
    >>> issubclass(treeclone.RetraceWarning, UserWarning)
    True
    """


def where(fun: Callable) -> str:
    """``fun``'s name and the place it is defined, for messages.

    >>> from treeclone._retrace import where
    >>> def step(state):
    ...     pass
    >>> where(step).startswith("step (")
    True
    """
    while hasattr(fun, "func") and not hasattr(fun, "__code__"):  # functools.partial
        fun = fun.func
    name = getattr(fun, "__name__", None) or repr(fun)  # as JAX names it
    code = getattr(getattr(fun, "__wrapped__", fun), "__code__", None)
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


# --- what the arguments look like, by key path --------------------------------------------------

# A descriptor is ("leaf", shape, dtype, weak_type, text, shared_with),
# ("node", type, arity, data) or ("same", path of the container it is).
Descriptors = dict[str, tuple]


def _leaf(x: Any) -> tuple[Any, Any, Any, str]:
    """``(shape, dtype, weak_type, text)`` of a leaf: its aval at trace time (a tracer's)."""
    aval = getattr(x, "aval", None)
    if aval is None:
        try:
            aval = jax.typeof(x)
        except Exception:  # noqa: BLE001 - a leaf JAX has no type for: named by its type
            return None, type(x), None, type(x).__name__
    try:
        text = aval.str_short(short_dtypes=True)
    except Exception:  # noqa: BLE001 - an aval without str_short
        text = str(aval)
    shape = getattr(aval, "shape", None)
    return shape, getattr(aval, "dtype", None), getattr(aval, "weak_type", None), text


def describe(sdef: Any, objs: list, leaves: list, layout: Layout) -> tuple[Descriptors, list]:
    """The descriptor at each key path of the arguments of ``sdef`` (rebuilt as ``objs``, with
    ``leaves``), and the first key path of each leaf slot."""
    paths = Paths(sdef, objs, layout)
    info = paths.info
    slot_paths: list[str] = [""] * sdef.num_leaves
    out: Descriptors = {}
    for n in sorted(paths.paths):  # the structure's own order, so "first" is stable
        p, entry = paths.paths[n], info[n]
        if isinstance(entry, EntryInfo.Leaf):
            s = entry.slot
            first = slot_paths[s] = slot_paths[s] or p
            out[p] = ("leaf", *_leaf(leaves[s]), None if first == p else first)
        elif isinstance(entry, EntryInfo.Ref):
            out[p] = ("same", paths.paths.get(entry.target, "?"))
        else:
            data = entry.data
            # A record outlives its trace, so it keeps no tracer: static data holding one is
            # recorded as None.
            out[p] = ("node", entry.node_type, entry.arity, None if holds_tracer(data) else data)
    return out, slot_paths


def _same(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return a is b
    if a[0] != b[0]:
        return False
    if a[0] == "node":
        return a[1] is b[1] and a[2] == b[2] and same_data(a[3], b[3])
    return same_data(a, b)


def _what(d: tuple) -> str:
    if d[0] == "leaf":
        return d[4]
    if d[0] == "same":
        return f"the same object as {d[1]}"
    return f"a {d[1].__name__}"


def _change(a: tuple | None, b: tuple | None) -> tuple[str, bool]:
    """What changed from descriptor ``a`` to ``b``, and whether it covers the children."""
    if a is None:
        return f"added ({_what(b)})", True  # type: ignore[arg-type]
    if b is None:
        return f"removed (was {_what(a)})", True
    if a[0] != b[0] or (a[0] == "node" and a[1] is not b[1]):
        return f"changed from {_what(a)} to {_what(b)}", True
    if a[0] == "same":
        return f"now the same object as {b[1]} (before: as {a[1]})", True
    if a[0] == "node":
        ty, old, new = a[1], a[2], b[2]
        if ty is dict:
            gone = [k for k in a[3] if k not in set(b[3])]
            added = [k for k in b[3] if k not in set(a[3])]
            parts = [f"key added: {', '.join(map(repr, added))}"] if added else []
            parts += [f"key removed: {', '.join(map(repr, gone))}"] if gone else []
            return "; ".join(parts) or "keys changed", True
        if old != new:
            if ty in (list, tuple):
                verb = "grew" if new > old else "shrank"
                return f"{ty.__name__} {verb} from {old} to {new}", True
            return f"{ty.__name__} changed from {old} to {new} children", True
        return f"{ty.__name__}'s static data changed from {_short(a[3])} to {_short(b[3])}", False
    # Two leaves.
    if a[5] != b[5]:
        if b[5] is None:
            return f"no longer the same object as {a[5]}", False
        return f"now the same object as {b[5]}", False
    if a[1] != b[1]:
        return f"shape changed from {a[4]} to {b[4]}", False
    if a[2] != b[2]:
        return f"dtype changed from {a[4]} to {b[4]}", False
    if a[3] != b[3]:
        return f"weak type changed from {a[3]} to {b[3]} ({b[4]})", False
    return f"type changed from {a[4]} to {b[4]}", False


def _short(x: Any) -> str:
    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    return short.repr(x)


def _under(path: str, parent: str) -> bool:
    return path.startswith(parent) and path[len(parent) : len(parent) + 1] in ("[", ".")


def differences(old: Descriptors, new: Descriptors) -> list[tuple[str, str]]:
    """``(key path, what changed)`` from ``old`` to ``new``; a change that replaces a node's
    children (a list that grew) is said once, at the node.

    >>> from treeclone._retrace import differences
    >>> node = lambda n: ("node", list, n, None)
    >>> differences({"xs": node(3)}, {"xs": node(4), "xs[3]": ("same", "ys")})
    [('xs', 'list grew from 3 to 4')]
    """
    changes: list[tuple[str, str]] = []
    covered: list[str] = []
    for p in sorted(old.keys() | new.keys(), key=lambda p: (len(p), p)):  # parents first
        if any(_under(p, c) for c in covered):
            continue
        a, b = old.get(p), new.get(p)
        if _same(a, b):
            continue
        text, covers = _change(a, b)
        changes.append((p, text))
        if covers:
            covered.append(p)
    return sorted(changes)


def _statics_by_name(statics: tuple | None, name: Callable[[int], str]) -> dict[str, tuple]:
    if statics is None:
        return {}
    _, positional, keyword = statics
    found = {name(i): (ty, v) for i, ty, v in positional}
    found.update({str(k): (ty, v) for k, ty, v in keyword})
    return found


def static_differences(
    old: tuple | None, new: tuple | None, name: Callable[[int], str]
) -> list[tuple[str, str]]:
    """``(argument, what changed)`` between two calls' static arguments."""
    a, b = _statics_by_name(old, name), _statics_by_name(new, name)
    changes = []
    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    for k in sorted(a.keys() | b.keys()):
        if k not in a:
            changes.append((k, "static argument added"))
        elif k not in b:
            changes.append((k, "static argument removed"))
        elif a[k][0] is not b[k][0]:
            old_t, new_t = a[k][0].__name__, b[k][0].__name__
            changes.append((k, f"static value's type changed from {old_t} to {new_t}"))
        elif not same_data(a[k][1], b[k][1]):
            old_v, new_v = short.repr(a[k][1]), short.repr(b[k][1])
            changes.append((k, f"static value changed from {old_v} to {new_v}"))
    return changes


def _donation_differences(old: Record, new: Record) -> list[tuple[str, str]]:
    a, b = old.key[2], new.key[2]
    if a == b:
        return []
    if old.key[0] != new.key[0] or a is None or b is None:
        return [("", "donated arguments changed")]
    return [
        (p, "now donated" if was else "no longer donated")
        for p, was, now in zip(new.slot_paths, a.keep, b.keep, strict=False)
        if was != now
    ]


def _placement_differences(old: Record, new: Record) -> list[tuple[str, str]]:
    """The leaves placed otherwise (the key's fifth entry: ``_jit.placement``), when both
    traces were keyed on their arguments' placements and have one structure."""
    a, b = old.key[4], new.key[4]
    if a == b or a is None or b is None or old.key[0] != new.key[0]:
        return []
    return [
        (p, f"sharding changed from {_placed(x)} to {_placed(y)}")
        for p, x, y in zip(new.slot_paths, a, b, strict=False)
        if x != y
    ]


def _placed(sharding: Any) -> str:
    """A sharding as a short text: a NamedSharding's spec, else the sharding itself."""
    spec = getattr(sharding, "spec", None)
    return "uncommitted" if sharding is None else str(spec if spec is not None else sharding)


# --- the record of a function's traces ---------------------------------------------------------


class _StandIn:
    """A leaf of a recorded structure rebuilt for its description: only its aval."""

    __slots__ = ("aval",)

    def __init__(self, aval: Any):
        self.aval = aval


def _avals(leaves: list) -> tuple:
    """Each leaf's aval (a tracer's at trace time; None for a value without one): what the
    cache key does not hold about the leaves, and no reference to a tracer."""
    return tuple(getattr(x, "aval", None) for x in leaves)


class Record:
    """One trace: its cache key, its leaves' avals and layout, and (under a policy that writes
    back) the structure and avals of the arguments as the function left them. Cheap to make;
    the descriptors by key path are worked out only when a message needs them."""

    __slots__ = ("_described", "after", "avals", "key", "layout")

    def __init__(self, key: tuple, avals: tuple, layout: Layout, after: tuple | None):
        self.key, self.avals, self.layout, self.after = key, avals, layout, after
        self._described: dict[bool, tuple[Descriptors, list]] = {}

    def described(self, after: bool = False) -> tuple[Descriptors, list]:
        """The descriptors and first key path per slot of the arguments as given (or, with
        ``after``, as the function left them)."""
        found = self._described.get(after)
        if found is None:
            sdef, avals = self.after if after else (self.key[0], self.avals)  # type: ignore[misc]
            stand_ins = [_StandIn(a) for a in avals]
            _, objs = sdef.unflatten_nodes(stand_ins)
            found = self._described[after] = describe(sdef, objs, stand_ins, self.layout)
        return found

    @property
    def where(self) -> Descriptors:
        return self.described()[0]

    @property
    def slot_paths(self) -> list:
        return self.described()[1]

    def left_its_own_structure(self) -> bool:
        """Whether the function left its arguments in another structure than it was given."""
        return self.after is not None and self.after != (self.key[0], self.avals)


def record_of(key: tuple, leaves: list, layout: Layout) -> Record:
    """The record of a call outside a trace (its leaves concrete values, each described by
    its JAX type), for :func:`call_differences`."""
    avals = []
    for x in leaves:
        aval = getattr(x, "aval", None)
        if aval is None:
            try:
                aval = jax.typeof(x)
            except Exception:  # noqa: BLE001 - a leaf JAX has no type for (a static one)
                aval = None
        avals.append(aval)
    return Record(key, tuple(avals), layout, None)


def call_differences(old: Record, new: Record, name: Callable[[int], str]) -> list[tuple[str, str]]:
    """``(key path or argument, what changed)`` from the call ``old`` to ``new``: the static
    arguments, the structure, sharing and types of the others, their donation and placement."""
    return [
        *static_differences(old.key[1], new.key[1], name),
        *differences(old.where, new.where),
        *_passing_differences(old, new),
        *_donation_differences(old, new),
        *_placement_differences(old, new),
    ]


def _passing_differences(old: Record, new: Record) -> list[tuple[str, str]]:
    """The arguments given by position in one call and by keyword in the other: the same key
    paths, but another structure of ``(args, kwargs)`` (as under jax.jit, which traces
    again)."""
    a = set(old.layout.names[: old.layout.num_args])
    b = set(new.layout.names[: new.layout.num_args])
    changes = [(n, "now given by keyword (before: by position)") for n in a - b if n in new.where]
    changes += [(n, "now given by position (before: by keyword)") for n in b - a if n in old.where]
    return sorted(changes)


def structure_difference(old: Record, new: Record) -> str:
    """The structure of ``(args, kwargs)`` of ``old`` and ``new`` as JAX prints it, for two
    calls whose key paths, types, sharing and static values :func:`call_differences` found
    the same."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 300

    def text(record: Record) -> str:
        sdef = record.key[0]
        root = sdef.unflatten([_StandIn(a) for a in record.avals])
        return short.repr(jax.tree_util.tree_structure(root))

    return f"the arguments' structure changed from {text(old)} to {text(new)}"


class History:
    """The traces of one function under one policy (``_jit.inner.Inner``), and what they say."""

    def __init__(self, fun: Callable, policy: Any, name: Callable[[int], str]) -> None:
        self.fun_where = where(fun)
        self.policy = policy
        self.policy_name = policy.name or repr(policy)
        self.name = name
        self.records: collections.deque[Record] = collections.deque(maxlen=_HISTORY)
        self.streak = 0  # traces in a row that followed from the previous call's write-back
        self.warned = False

    def traced(
        self, key: tuple, leaves: list, layout: Layout, args_after: tuple[tuple, dict] | None
    ) -> None:
        """Record a trace of arguments ``key`` (``jit_call.Key``) with ``leaves``
        (tracers); ``args_after``: the rebuilt ``(args, kwargs)`` after the function ran.
        Never raises: an explanation is not worth a failed call."""
        try:
            self._traced(key, leaves, layout, args_after)
        except Exception:  # noqa: BLE001 - best effort, see above
            pass

    def _traced(
        self, key: tuple, leaves: list, layout: Layout, args_after: tuple[tuple, dict] | None
    ) -> None:
        after = None
        if args_after is not None and self.policy.mutations == "propagate":
            after_leaves, after_def, _ = _native.flatten_shared((*args_after[0], args_after[1]))
            after = (after_def, _avals(after_leaves))
        record = Record(key, _avals(leaves), layout, after)
        previous = self.records[-1] if self.records else None
        if previous is not None and explaining():
            changes = min(
                (self._differences(old, record) for old in reversed(self.records)),
                key=len,
                default=[],
            )
            if changes:
                logger.warning(self._explanation(changes))
        if previous is not None:
            self._count(previous, record)
        self.records.append(record)

    def _differences(self, old: Record, new: Record) -> list[tuple[str, str]]:
        return call_differences(old, new, self.name)

    def _explanation(self, changes: list[tuple[str, str]]) -> str:
        lines = [
            f"treeclone.jit traced {self.fun_where} again (policy {self.policy_name}): its "
            "arguments differ from those of the closest earlier trace:"
        ]
        lines += [f"  * {p}: {text}" if p else f"  * {text}" for p, text in changes]
        return "\n".join(lines)

    def _count(self, previous: Record, record: Record) -> None:
        """Count a trace whose new structure is the one the previous call's write-back left:
        the function changed its arguments' structure, and every key path that differs now is
        as it left it (the same static arguments); warn once when ``RETRACE_STREAK`` such
        traces come in a row. Only a function that changes its own structure pays for the
        descriptors (an exact match needs none)."""
        own = previous.left_its_own_structure() and previous.key[1] == record.key[1]
        if own and previous.after != (record.key[0], record.avals):
            # Not exactly what it left (the appended value may be shared with an argument
            # that is new at this call): compare the paths that differ.
            after = previous.described(after=True)[0]
            changes = differences(previous.where, record.where)
            own = bool(changes) and all(
                _same(after.get(p), record.where.get(p))
                and not _same(previous.where.get(p), after.get(p))
                for p, _ in changes
            )
        self.streak = self.streak + 1 if own else 0
        if own and self.streak >= RETRACE_STREAK and not self.warned:
            self.warned = True
            changes = differences(previous.where, record.where)
            what = "; ".join(f"{p}: {text}" for p, text in changes)
            warnings.warn(
                see(
                    "retrace-warning",
                    f"treeclone.jit: {self.fun_where} was traced and compiled again on each of "
                    f"its last {RETRACE_STREAK + 1} calls (policy {self.policy_name}), each time "
                    "because the previous call's write-back changed the structure of its "
                    f"arguments ({what}). Every new structure is a new trace and compilation. "
                    "Keep the structure fixed (preallocate an array and write into it with "
                    ".at[i].set instead of appending to a list), or keep what changes out of the "
                    "jitted function's arguments (or make it a static argument).",
                ),
                RetraceWarning,
                stacklevel=_user_stacklevel(),
            )


# --- the user's frame ---------------------------------------------------------------------------

# treeclone's and JAX's own files (a package's directory with the separator, so that
# ``.../jax/`` does not match ``.../jax_triton/``).
_TREECLONE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_INTERNAL = (_TREECLONE,) + tuple(
    os.path.dirname(str(m.__file__)) + os.sep
    for m in (jax, sys.modules.get("jaxlib"))
    if m is not None and getattr(m, "__file__", None)
)
# JAX's own explanation of a miss names the user's call, not treeclone's call of the inner jit.
_jax_compat.exclude_from_user_frames(_TREECLONE)


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the innermost frame outside treeclone, JAX and the standard
    library: the user's call that traced (the warning is raised deep inside JAX's trace)."""
    frame: types.FrameType | None = sys._getframe(2)  # the caller of warnings.warn's caller
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1
