"""``treeclone.vmap``'s batch axes under a policy: of each distinct input leaf, from
``in_axes`` (:class:`InAxes`), and of each leaf of the call's result, from where it ends up
once the function has run (:class:`ResultAxes`): state written into an input takes that input's
axis, a value the function returns takes ``out_axes``, and a batched value written where the
batch has one value is a ``ValueError`` naming the key path (:class:`PlaceError`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treeclone import _jax_compat, _native
from treeclone._docs import see
from treeclone._effects import ChildKeys, Diffed, Layout, Paths
from treeclone._jax_compat import BatchTracer as _BatchTracer
from treeclone._jax_compat import flatten_axes as _flatten_axes
from treeclone._jax_compat import keystr, require
from treeclone._lift import Call, Naming, jit_keystr
from treeclone._native import EntryInfo

Node = EntryInfo.Node


Leaf = EntryInfo.Leaf


Ref = EntryInfo.Ref


class _Mixed:
    """The axis of a container whose parts are mapped along different axes (``in_axes`` gives
    its children their own axes): a value put there has no single axis to take."""

    def __repr__(self) -> str:
        return "<mixed>"


MIXED: Any = _Mixed()


_UNSET: Any = object()


class PlaceError(ValueError):
    """A problem with where a value ends up, found while ``jax.vmap`` traces: re-raised as a
    plain ``ValueError`` from the call, outside JAX's frames."""


class _Slot:
    """A marker leaf: the ``index``-th distinct leaf of the call."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _is_axis(x: Any) -> bool:
    return x is None or (isinstance(x, (int, np.integer)) and not isinstance(x, bool))


def _norm(axis: Any, rank: int) -> Any:
    """``axis`` of an array of rank ``rank`` (its batched rank), negative ones counted from
    the end; None stays None."""
    if axis is None or axis is MIXED:
        return axis
    axis = int(axis)
    return axis + rank if axis < 0 else axis


def _one_level(tree: Any) -> tuple[list, Any]:
    """A tree's children and its one-level structure (None children kept as children)."""
    return jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree)


class InAxes:
    """``in_axes`` broadcast to a flattened call: the axis of each distinct leaf
    (``slot_axes``, normalized) and of each container (``node_axes``: its axis when one
    ``in_axes`` entry covers all of it, else :data:`MIXED`), with the key path of each leaf
    and container for messages."""

    def __init__(self, call: Call, naming: Naming, in_axes: Any):
        n = len(call.leaves)
        self.pre_info = call.sdef.node_info()
        root, self.objs = call.sdef.unflatten_nodes([_Slot(s) for s in range(n)])
        args, kwargs = tuple(root[:-1]), root[-1]
        names = [naming.name(i) for i in range(len(args))]
        self.names = names
        self.root = len(self.pre_info) - 1
        self.kwargs_node = self.pre_info[self.root].children[-1]

        def name(path: tuple) -> str:
            first, rest = path[0], path[1:]
            if first.idx == 0:  # (args, kwargs)[0][i]
                return names[rest[0].idx] + jit_keystr(rest[1:])
            return str(rest[0].key) + jit_keystr(rest[1:])

        tree = (args, kwargs)
        flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
        per_leaf = _flatten_axes("vmap in_axes", treedef, (in_axes, 0), kws=True)
        self.slot_axes: list[Any] = [_UNSET] * n
        self.slot_paths: list[str] = [""] * n
        for (path, marker), axis in zip(flat, per_leaf, strict=True):
            s = marker.index
            axis = _norm(axis, np.ndim(call.leaves[s]))
            if self.slot_axes[s] is _UNSET:
                self.slot_axes[s], self.slot_paths[s] = axis, name(path)
            elif self.slot_axes[s] != axis:
                raise ValueError(
                    see(
                        "vmap-axes",
                        f"vmap in_axes: {self.slot_paths[s]} and {name(path)} are the same value, "
                        f"given the axes {self.slot_axes[s]} and {axis}. Under this policy a value "
                        "passed at two places is one input of the computation (identity is "
                        "preserved), so it has one batch axis: give both places the same axis, or "
                        "pass a copy.",
                    )
                )
        for s, axis in enumerate(self.slot_axes):
            if axis is _UNSET:  # not reachable by JAX's flatten (cannot happen): unmapped
                self.slot_axes[s] = None

        # Containers: the axis of the in_axes entry that covers each one.
        node_of = {
            id(o): k
            for k, (o, e) in enumerate(zip(self.objs, self.pre_info, strict=True))
            if isinstance(e, Node)
        }
        self.node_axes: dict[int, Any] = {}
        paths = Paths(call.sdef, self.objs, Layout(len(args), names))
        self.node_paths, self.keys = paths.paths, paths.keys

        def cover(axis: Any, subtree: Any) -> None:
            for obj in _native.flatten_shared(subtree)[2]:
                k = node_of.get(id(obj))
                if k is None:
                    continue
                if self.node_axes.get(k, axis) != axis:
                    raise ValueError(
                        see(
                            "vmap-axes",
                            f"vmap in_axes: {self.node_paths.get(k, '?')} is one object reached "
                            f"from places given the axes {self.node_axes[k]} and {axis}; under "
                            "this policy it stays one object, so it has one batch axis: give its "
                            "places the same axis.",
                        )
                    )
                self.node_axes[k] = axis

        spec = (in_axes, 0)
        jax.tree_util.tree_map(cover, spec, tree, is_leaf=lambda x: x is None)

    def of_node(self, k: int) -> Any:
        """The axis of pre-call node ``k`` (a leaf's, a container's, or MIXED)."""
        entry = self.pre_info[k]
        if isinstance(entry, Leaf):
            return self.slot_axes[entry.slot]
        if isinstance(entry, Ref):
            return self.of_node(entry.target)
        return self.node_axes.get(k, MIXED)


# What jax.vmap maps: arrays (tracers are jax.Arrays), NumPy values and Python numbers.
_JAX_VALUES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def check_sizes(call: Call, axes: InAxes, axis_size: int | None) -> None:
    """The batch size of the mapped leaves, checked as ``jax.vmap`` checks it, with messages
    that name the user's key paths (``jax.vmap`` would name the flattened leaves)."""
    sizes: dict[int, list[str]] = {}
    for s, axis in enumerate(axes.slot_axes):
        if axis is None:
            continue
        x, where = call.leaves[s], axes.slot_paths[s]
        if not isinstance(x, _JAX_VALUES) and not _jax_compat.is_ref(x):
            raise TypeError(  # jax.vmap's error, with the key path; traced= is the way out
                see(
                    "not-a-jax-type",
                    f"{where}: argument {x!r} of type {type(x)} is not a valid JAX type (give "
                    "traced='arrays' to leave leaves that are not arrays static, as equinox does)",
                )
            )
        shape = np.shape(x)
        if not 0 <= axis < len(shape):
            raise ValueError(
                f"vmap was requested to map its argument {where} along axis {axis}, which "
                f"implies that its rank should be at least {axis + 1}, but is only "
                f"{len(shape)} (its shape is {shape})"
            )
        sizes.setdefault(int(shape[axis]), []).append(f"axis {axis} of {where}")
    if axis_size is not None:
        sizes.setdefault(int(axis_size), []).append("axis_size")
    if len(sizes) > 1:
        lines = [f"  * size {n}: {', '.join(places)}" for n, places in sizes.items()]
        raise ValueError(
            "vmap got inconsistent sizes for array axes to be mapped:\n" + "\n".join(lines)
        )
    if not sizes:
        raise ValueError("vmap must have at least one non-None value in in_axes")


def batched(x: Any, traces: set[int]) -> bool:
    """Whether ``x`` varies along the batch of this call's vmap (one of ``traces``, by id)."""
    if not isinstance(x, require(_BatchTracer)):
        return False
    return id(getattr(x, "_trace", None)) in traces and x.batch_dim is not None


class ResultAxes:
    """The batch axis of each leaf of a call's result, worked out from where it ends up
    (given to ``Diffed.plan`` as ``forced``): in a caller's container, the axis ``in_axes``
    gave that place (a container moved elsewhere keeps its own); in the function's result,
    ``out_axes``. It also says which input leaves must be produced by the computation (their
    place has another axis than they came in with), and raises, naming the place, for a batched
    value written where the batch has one value."""

    def __init__(
        self,
        fun: Callable[..., Any],
        axes: InAxes,
        out_axes: Any,
        in_leaves: list,
        traces: set[int],
        static: Callable[[Any], bool],
    ):
        self.fun, self.axes, self.out_axes, self.static = fun, axes, out_axes, static
        self.in_leaves, self.traces = in_leaves, traces
        self.out_list: list[Any] = []

    # -- the result ------------------------------------------------------------------------

    def forced(self, diffed: Diffed) -> list[bool]:
        """Per leaf of ``diffed``'s result, whether the computation must output it (an input
        leaf whose place has another axis than it came in with)."""
        origins, rleaves = diffed.origins, diffed.result_leaves
        self.info, self.objs = diffed.result_def.node_info(), diffed.result_objs
        self.keys = ChildKeys(self.objs, self.info)
        self.origins, self.rleaves = origins, rleaves
        self.place: list[Any] = [_UNSET] * len(rleaves)
        self.where: list[str] = [""] * len(rleaves)
        self.into_input: list[bool] = [False] * len(rleaves)
        self.walked: set[int] = set()
        self.left_alone: list[int] = []  # arguments a policy per argument does not write back
        slot_of = {id(leaf): s for s, leaf in enumerate(self.in_leaves)}
        root = len(self.info) - 1
        if origins[root] is None and all(o is None for o in origins):
            self.out(root, self.out_axes, "result")  # nothing is written back: all result
        else:
            children = self.info[root].children  # (arguments, result[, detached])
            self.inputs(children[0])
            self.out(children[1], self.out_axes, "result")
            for c in children[2:]:
                for d in self.info[c].children:
                    if self.origins[d] is not None:
                        self.inputs(d)
            for n in self.left_alone:
                self.discarded(n, slot_of)
        forced, self.out_list = [], []
        for r, leaf in enumerate(rleaves):
            place = self.place[r]
            if place is _UNSET:  # cannot happen: every leaf is under the root
                place = 0
            s = slot_of.get(id(leaf), -1)
            is_input = s >= 0 and self.in_leaves[s] is leaf
            force = is_input and place != self.axes.slot_axes[s]
            forced.append(force)
            if is_input and not force:
                continue
            if place is None and batched(leaf, self.traces):
                self._raise_batched_into_unmapped(r)
            if place is not None and not 0 <= place <= np.ndim(leaf):
                raise PlaceError(
                    see(
                        "vmap-write-back",
                        f"{self.where[r]}: the batch axis of this place is {place}, but the value "
                        f"{self._name()} left there has rank {np.ndim(leaf)} for each example, so "
                        f"it has no axis {place} once batched (rank {np.ndim(leaf) + 1})",
                    )
                )
            self.out_list.append(place)
        return forced

    # -- where each leaf is ----------------------------------------------------------------

    def _path(self, n: int, j: int, base: str) -> str:
        try:
            return base + keystr((self.keys.keys(n)[j],))
        except Exception:  # noqa: BLE001 - naming is best effort
            return f"{base}[{j}]"

    def _assign(self, r: int, axis: Any, where: str, into_input: bool) -> None:
        if self.static(self.rleaves[r]):  # traced= left it static: one value, never mapped
            axis = None
        if axis is MIXED:
            raise PlaceError(
                see(
                    "vmap-write-back",
                    f"{where}: {self._name()} put a new value where in_axes gives no single batch "
                    "axis (the container's entries are mapped along different axes, and this "
                    "place had none of its own), so it cannot be written back. Give the "
                    "container one axis in in_axes, or return the value instead.",
                )
            )
        axis = _norm(axis, np.ndim(self.rleaves[r]) + 1)
        if self.place[r] is not _UNSET and self.place[r] != axis:
            raise PlaceError(
                see(
                    "vmap-write-back",
                    f"{self._name()} left one value at {self.where[r]} (batch axis "
                    f"{self.place[r]}) and at {where} (batch axis {axis}). A value is one output "
                    "of the computation, with one batch axis: put a copy at one of the places "
                    "(jnp.copy(x)), or give the places the same axis.",
                )
            )
        if self.place[r] is _UNSET:
            self.place[r], self.where[r], self.into_input[r] = axis, where, into_input

    def _name(self) -> str:
        return getattr(self.fun, "__qualname__", None) or repr(self.fun)

    def _position(self, n: int, k: int, j: int) -> Any:
        """The axis ``in_axes`` gives child ``j`` of result node ``n``, the caller's node
        ``k``: the container's own when it has one, else that of the entry it had under the
        same key (MIXED for a new key)."""
        axis = self.axes.node_axes.get(k, MIXED)
        if axis is not MIXED:
            return axis
        try:
            i = self.axes.keys.index(k, self.keys.keys(n)[j])
        except Exception:  # noqa: BLE001
            return MIXED
        if i is None:
            return MIXED
        return self.axes.of_node(self.axes.pre_info[k].children[i])

    def _base(self, k: int) -> str:
        return self.axes.node_paths.get(k, "(the arguments)")

    def _input_path(self, n: int, k: int, j: int) -> str:
        """The key path of child ``j`` of result node ``n``, the caller's node ``k``."""
        if k == self.axes.root:
            return self.axes.names[j] if j < len(self.axes.names) else "(keyword arguments)"
        if k == self.axes.kwargs_node:
            try:
                return str(self.keys.keys(n)[j].key)
            except Exception:  # noqa: BLE001 - naming is best effort
                return f"kwargs[{j}]"
        return self._path(n, j, self._base(k))

    def inputs(self, n: int) -> None:
        """Result node ``n`` is the caller's container ``origins[n].node``: its leaves take
        the axes of their places in it; containers under it keep their own."""
        if n in self.walked:
            return
        self.walked.add(n)
        k = self.origins[n].node
        for j, c in enumerate(self.info[n].children):
            entry = self.info[c]
            if isinstance(entry, Ref):
                continue
            if self.origins[c] is not None:
                self.inputs(c)
                continue
            if k in (self.axes.root, self.axes.kwargs_node) and isinstance(entry, Node):
                # An argument whose own policy (clone, strict) leaves the caller's object
                # alone: what the function left in it is dropped, so no place there is
                # written; placed once the result is (it may be returned).
                self.left_alone.append(c)
                continue
            axis = self._position(n, k, j)
            where = self._input_path(n, k, j)
            if isinstance(entry, Leaf):
                self._assign(entry.slot, axis, where, True)
            else:
                self.new(c, axis, where, True)

    def discarded(self, n: int, slot_of: dict[int, int]) -> None:
        """Result node ``n`` is an argument left alone and not returned: its values are
        dropped, so any batch axis does. An input leaf keeps its own (it is not output), a
        new value gets 0 (valid for every value, batched or not)."""
        agenda = [n]
        while agenda:
            m = agenda.pop()
            if m in self.walked:
                continue
            self.walked.add(m)
            for c in self.info[m].children:
                entry = self.info[c]
                if isinstance(entry, Node):
                    agenda.append(c)
                elif isinstance(entry, Leaf) and self.place[entry.slot] is _UNSET:
                    leaf = self.rleaves[entry.slot]
                    s = slot_of.get(id(leaf))
                    own = s is not None and self.in_leaves[s] is leaf
                    self.place[entry.slot] = self.axes.slot_axes[s] if own else 0  # type: ignore[index]

    def new(self, n: int, axis: Any, where: str, into_input: bool) -> None:
        """Result node ``n`` is a new container at a place of axis ``axis``."""
        if n in self.walked:
            return
        self.walked.add(n)
        for j, c in enumerate(self.info[n].children):
            entry = self.info[c]
            if not into_input:  # in the result: out_axes, checked where it meets an input
                self.out(c, axis, self._path(n, j, where))
                continue
            if isinstance(entry, Ref):
                continue
            if self.origins[c] is not None:
                self.inputs(c)
            elif isinstance(entry, Leaf):
                self._assign(entry.slot, axis, self._path(n, j, where), into_input)
            else:
                self.new(c, axis, self._path(n, j, where), into_input)

    def out(self, n: int, spec: Any, where: str) -> None:
        """Result node ``n`` is at ``where`` in the function's result, with the part ``spec``
        of ``out_axes`` over it."""
        entry = self.info[n]
        target = entry.target if isinstance(entry, Ref) else n
        if target in self.left_alone and target not in self.walked:
            self.out(target, spec, where)  # an argument left alone, returned: a new container
            return
        if self.origins[target] is not None or n != target:
            if self.origins[target] is not None:
                self.inputs(target)  # (walked already unless detached and returned)
            self.check(target, spec, where)  # an input, or a new container seen before
            return
        if _is_axis(spec):
            if isinstance(entry, Leaf):
                self._assign(entry.slot, spec, where, False)
            else:
                self.new(n, spec, where, False)
            return
        if isinstance(entry, Leaf):
            self._raise_prefix(where, spec)
        self.walked.add(n)
        specs = self._match(n, spec, where)
        for j, (c, sub) in enumerate(zip(entry.children, specs, strict=True)):
            self.out(c, sub, self._path(n, j, where))

    def _match(self, n: int, spec: Any, where: str) -> list:
        children, spec_def = _one_level(spec)
        try:
            _, node_def = _one_level(self.objs[n])
        except Exception:  # noqa: BLE001
            node_def = None
        if node_def != spec_def:
            self._raise_prefix(where, spec)
        return children

    def check(self, n: int, spec: Any, where: str) -> None:
        """Result node ``n`` (the caller's container returned, or a container already placed)
        is at ``where`` in the result: its leaves already have their axes, which the part
        ``spec`` of ``out_axes`` must agree with."""
        entry = self.info[n]
        if isinstance(entry, Ref):
            self.check(entry.target, spec, where)
            return
        if isinstance(entry, Leaf):
            if not _is_axis(spec):
                self._raise_prefix(where, spec)
            want = _norm(spec, np.ndim(self.rleaves[entry.slot]) + 1)
            have = self.place[entry.slot]
            if have is not _UNSET and have != want:
                raise PlaceError(
                    see(
                        "vmap-write-back",
                        f"{where}: out_axes gives this place the axis {spec}, but it holds "
                        f"{self.where[entry.slot] or 'a value'}, batched along {have} where it is "
                        "written back. A returned input container is the caller's own object, "
                        "whose contents keep the axes of in_axes: make out_axes agree there, or "
                        "return a new container.",
                    )
                )
            return
        specs = [spec] * len(entry.children) if _is_axis(spec) else self._match(n, spec, where)
        for j, (c, sub) in enumerate(zip(entry.children, specs, strict=True)):
            self.check(c, sub, self._path(n, j, where))

    # -- errors ------------------------------------------------------------------------------

    def _raise_prefix(self, where: str, spec: Any) -> None:
        raise PlaceError(
            "vmap out_axes specification must be a tree prefix of the corresponding value, "
            f"got specification {spec!r} for the value at {where}"
        )

    def _raise_batched_into_unmapped(self, r: int) -> None:
        where = self.where[r]
        if self.into_input[r]:
            raise PlaceError(
                see(
                    "vmap-write-back",
                    f"{where}: {self._name()} wrote a batched value (one per example) into an "
                    "input mapped with in_axes None, which holds one value for the whole batch; "
                    "nothing was written back. Map that input (give it an axis in in_axes), or "
                    "write a value that is the same for every example.",
                )
            )
        raise PlaceError(
            see("vmap-write-back", f"{where}: vmap has mapped output but out_axes is None")
        )


def copy_returned_inputs(
    out: Any,
    out_axes: Any,
    leaves: list,
    axes: InAxes,
    inputs: set[int],
    static: Callable[[Any], bool],
) -> Any:
    """``out`` with a copy in each place where ``out_axes`` wants a value along another axis
    than the value already has: an input leaf returned along another axis than it came in with
    (an unmapped input returned with ``out_axes`` 0, say), or one value returned at two places
    of different axes (``return y, y`` with ``out_axes=(0, 1)``). A leaf is one output of the
    computation, with one axis; the copy is a value of its own. Input containers are left as
    they are (they are the caller's objects, whose contents keep their ``in_axes``); ``out`` is
    rebuilt only where a copy is put. A leaf that ``static`` says is left static (``traced=``)
    is not a value of the computation: it is never copied."""
    seen: dict[int, Any] = {id(x): a for x, a in zip(leaves, axes.slot_axes, strict=True)}

    def stop(x: Any) -> bool:
        return id(x) in inputs

    decisions: list[bool] = []  # for each leaf met, in order: copy it

    def find(axis: Any, subtree: Any) -> None:
        for x in jax.tree_util.tree_leaves(subtree, is_leaf=stop):
            if id(x) in inputs or not _is_axis(axis) or static(x):
                decisions.append(False)
                continue
            want = _norm(axis, np.ndim(x) + 1)
            have = seen.setdefault(id(x), want)
            decisions.append(have != want)

    try:
        jax.tree_util.tree_map(find, out_axes, out, is_leaf=lambda x: x is None)
    except ValueError:  # out_axes is not a prefix of out: said, with the place, by ResultAxes
        return out
    if not any(decisions):
        return out  # as the function built it
    it = iter(decisions)

    def fix(axis: Any, subtree: Any) -> Any:
        here = jax.tree_util.tree_leaves(subtree, is_leaf=stop)
        copy = [next(it) for _ in here]
        if not any(copy):
            return subtree
        marks = iter(copy)
        return jax.tree_util.tree_map(
            lambda x: jnp.array(x, copy=True) if next(marks) else x, subtree, is_leaf=stop
        )

    return jax.tree_util.tree_map(fix, out_axes, out, is_leaf=lambda x: x is None)


def container_ids(tree: Any) -> set[int]:
    """The ids of the containers (pytree nodes) of ``tree``."""
    _, sdef, objects = _native.flatten_shared(tree)
    return {id(o) for o, e in zip(objects, sdef.node_info(), strict=True) if isinstance(e, Node)}
