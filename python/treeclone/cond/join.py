"""Several traces joined into one plan: ``treeclone.cond`` and ``switch`` trace every branch
but run one, so every branch must leave the same structure behind, and one plan writes back
whatever any branch writes. Each branch's trace is kept as a :class:`BranchRecord`;
:func:`joined_plan` joins them (:func:`join_origins` per container), :func:`taken_plan` is one
branch's alone (a concrete predicate), and :class:`PathNamer` and :func:`say` describe where
and how two branches differ.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from treeclone import _native
from treeclone._docs import see
from treeclone._effects import Diffed, Layout, Paths, child_keys, same_data, same_static
from treeclone._jax_compat import DictKey, is_ref, keystr, unflatten_node
from treeclone._native import EntryInfo, Origin, Source
from treeclone._writeback import write_custom as _write_custom

# CallPlan's stub types the write-back hook; the function is the same.
write_custom: Any = _write_custom


class BranchRecord:
    """What tracing one branch left behind: its plan's parts and, per leaf position of the
    plan's structure (its ``Leaf`` entries in order), the slot, the operand slot it hands back
    as it came in (None: a new value), and its abstract value; the branch result's JAX
    structure and the abstract values of its leaves (to report a mismatch as JAX does); and,
    under a ``traced=`` rule, the leaves it leaves static (``statics``: position -> value),
    which are not output (JAX sees only arrays) and must be equal in every branch."""

    __slots__ = (
        "avals",
        "def_",
        "enclosing",
        "info",
        "inputs",
        "origins",
        "out_avals",
        "out_def",
        "refs",
        "result_child",
        "slots",
        "statics",
    )

    def __init__(self, diffed: Diffed, inputs: list, avals: list, refs: tuple):
        self.def_: Any = diffed.result_def
        self.origins: list[Any] = diffed.origins
        self.result_child: int | None = diffed.result_child
        # Rule J31's check of what its plan writes (``Diffed.enclosing_writes``).
        self.enclosing: Any = diffed.enclosing_writes()
        self.info: list[Any] = self.def_.node_info()
        self.slots: list[int] = [e.slot for e in self.info if isinstance(e, EntryInfo.Leaf)]
        self.inputs: list[int | None] = inputs
        self.avals: list[Any] = avals
        # The positions that hold a JAX Ref: the operand's own, handed back as it came in, and
        # not output by the branch (JAX never returns a Ref).
        self.refs: tuple[int, ...] = refs
        self.statics: dict[int, Any] = {}
        out_leaves, out_def = jax.tree_util.tree_flatten(diffed.out)
        self.out_def: Any = out_def
        self.out_avals: list[Any] = [aval_of(x) for x in out_leaves]


class RefAval(tuple):
    """A JAX Ref's abstract value ``(shape, dtype)``: unequal to an array's of the same type."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is RefAval and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


def aval_of(x: Any) -> Any:
    try:
        aval = jax.api_util.shaped_abstractify(x)
    except TypeError:
        return None
    if not hasattr(aval, "shape"):
        return aval
    pair = (tuple(aval.shape), canonical_dtype(aval.dtype))
    return RefAval(pair) if is_ref(x) else pair


def canonical_dtype(dtype: Any) -> Any:
    """A dtype as the branches' abstract values compare it: NumPy's own, or one of JAX's
    extended dtypes as it is (a typed PRNG key's ``key<fry>``, which NumPy cannot interpret;
    JAX's dtypes compare and hash as NumPy's do)."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return dtype
    return np.dtype(dtype)


def zeros_of(aval: tuple) -> Any:
    """A value of abstract value ``aval`` (``(shape, dtype)``): NumPy's zeros, or JAX's for an
    extended dtype (a typed PRNG key array over zero key data, as ``jnp.zeros`` makes it:
    NumPy has no such dtype)."""
    shape, dtype = aval
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return jax.numpy.zeros(shape, dtype)
    return np.broadcast_to(np.zeros((), dtype), shape)


def leaf_positions(info: list) -> dict[int, int]:
    """Entry index -> leaf position (the index of its ``Leaf`` among the entries)."""
    leaves = [n for n, e in enumerate(info) if isinstance(e, EntryInfo.Leaf)]
    return {n: p for p, n in enumerate(leaves)}


def key_difference(ea: Any, eb: Any) -> tuple[Any, bool] | None:
    """For two dicts of one type whose keys differ: the first key only one has, and whether
    it is the first's."""
    if ea.node_type is not eb.node_type or ea.node_type not in (dict, collections.OrderedDict):
        return None
    ka, kb = ea.data, eb.data
    if not (isinstance(ka, (list, tuple)) and isinstance(kb, (list, tuple))):
        return None
    for k in ka:
        if k not in kb:
            return k, True
    for k in kb:
        if k not in ka:
            return k, False
    return None


def keys_moved(o: Any) -> tuple | None:
    """The key order a dict's write-back imposes (None: kept keys keep their place)."""
    return tuple(o.key_order) if o.reordered and o.key_order is not None else None


def say_order(o: Any) -> str:
    order = keys_moved(o)
    return "its keys in their order" if order is None else f"its keys reordered to {list(order)}"


def say_aval(aval: Any) -> str:
    if isinstance(aval, RefAval):
        shape, dtype = aval
        return f"a Ref of type {dtype.name}{list(shape)}"
    if isinstance(aval, tuple):
        shape, dtype = aval
        return f"a value of type {dtype.name}{list(shape)}"
    return f"a value of type {aval}"


def static_difference(a: BranchRecord, pa: int, b: BranchRecord, pb: int) -> tuple | None:
    """How two branches differ at leaf positions ``pa`` and ``pb`` where one (or both) leaves
    a static leaf (``traced=``): each must leave one value there (``same_static``: the same
    object, or equal and of one type, a NaN equal to a NaN; a JAX cond cannot choose between
    two Python values), in words; None where they agree."""
    missing = object()
    va, vb = a.statics.get(pa, missing), b.statics.get(pb, missing)
    if va is not missing and vb is not missing and same_static(va, vb):
        return None

    def words(r: BranchRecord, p: int, v: Any) -> str:
        return say_aval(r.avals[p]) if v is missing else f"the static leaf {v!r}"

    return words(a, pa, va), words(b, pb, vb)


def say(namer: PathNamer, r: BranchRecord, n: int) -> str:
    """What one branch leaves at entry ``n`` of its plan's structure, in words."""
    e = r.info[n]
    if isinstance(e, EntryInfo.Leaf):
        return say_aval(r.avals[leaf_positions(r.info)[n]])
    if isinstance(e, EntryInfo.Ref):
        return f"the same object as at {namer.path(e.target)}"
    ty = e.node_type
    if ty is type(None):
        what = "None"
    elif ty is dict or (isinstance(e.data, (list, tuple)) and issubclass(ty, dict)):
        what = f"a {ty.__name__} with keys {list(e.data or ())}"
    elif ty in (list, tuple):
        what = f"a {ty.__name__} of {e.arity}"
    else:
        what = f"a {ty.__name__} with {e.arity} children"
    o = r.origins[n]
    if o is None:
        return what + (" (a new object)" if ty is not type(None) else "")
    own = namer.caller_path(o.node)
    return f"{what} (the caller's object from {own})"


class PathNamer:
    """Key paths of the entries of one branch's plan structure, for messages: the operands by
    the branch's parameter names (``layout``), the result as ``result``; ``call`` is the
    lift's :class:`~treeclone._lift.Call` of the operands (its structure and the caller's
    objects)."""

    def __init__(self, call: Any, layout: Layout, r: BranchRecord):
        self.call, self.layout, self.r = call, layout, r
        self.keys: dict[int, list[Any]] = {}  # each node's child keys, made once
        self.parent: dict[int, tuple[int, int]] = {}
        for n, e in enumerate(r.info):
            if isinstance(e, EntryInfo.Node):
                for j, c in enumerate(e.children):
                    self.parent[c] = (n, j)

    def caller_path(self, k: int) -> str:
        """The key path of the caller's container at node ``k`` of the call's structure."""
        paths = Paths(self.call.sdef, self.call.objects, self.layout).paths
        return paths.get(k, "?") or "(the operands)"

    def path(self, n: int) -> str:
        steps: list[tuple[int, int]] = []
        while n in self.parent:
            steps.append(self.parent[n])
            n = self.parent[n][0]
        steps.reverse()  # from the top down
        if self.r.result_child is None:  # strict: the structure is the result's
            return "result" + "".join(self._key(m, j) for m, j in steps)
        if not steps:
            return "(the call)"
        (_, part), rest = steps[0], steps[1:]
        if part == self.r.result_child:
            return "result" + "".join(self._key(m, j) for m, j in rest)
        if part != 0:
            return "(a container the branch detached)" + "".join(self._key(m, j) for m, j in rest)
        if not rest:
            return "(the operands)"
        (_, i), rest = rest[0], rest[1:]
        return self.layout.arg_name(i) + "".join(self._key(m, j) for m, j in rest)

    def _key(self, m: int, j: int) -> str:
        try:
            keys = self.keys.get(m)
            if keys is None:
                o = self.r.origins[m]
                obj = None if o is None else self.call.objects[o.node]
                keys = self.keys[m] = child_keys(obj, self.r.info[m])
            return keystr((keys[j],))
        except Exception:  # noqa: BLE001 - a name for a message
            return f"[{j}]"


def join_origins(origins: list) -> Any:
    """One origin for a node from every branch's (checked to be the same caller object): the
    attributes written are those any branch writes."""
    first = origins[0]
    if first is None:
        return None
    attrs: Any = ()
    for o in origins:
        if o.attrs is None:
            attrs = None
            break
        attrs = tuple(dict.fromkeys((*attrs, *o.attrs)))
    direct: Any = []
    for o in origins:
        if o.direct is None:
            direct = None
            break
        direct = list(dict.fromkeys((*direct, *[tuple(d) for d in o.direct])))
    if direct is not None and len({name for name, _ in direct}) != len(direct):
        direct = None
    return Origin(
        node=first.node,
        old_children=list(first.old_children),
        same_data=all(o.same_data for o in origins),
        writable=first.writable,
        key_order=first.key_order,
        reordered=any(o.reordered for o in origins),
        attrs=attrs,
        direct=direct,
        by_entry=all(o.by_entry for o in origins),
        old_keys=first.old_keys,
    )


def refined(r: BranchRecord) -> Any:
    """Branch ``r``'s plan structure with every leaf position its own slot: the branches
    share leaves in ways no one branch's structure has (each position gets its own output
    then, and positions that hold one value in every branch the same one). Built by
    rebuilding the structure's containers around distinct placeholder leaves."""
    info = r.info
    built: list[Any] = []
    pos = leaf_positions(info)
    for n, e in enumerate(info):
        if isinstance(e, EntryInfo.Leaf):
            aval = r.avals[pos[n]]
            if isinstance(aval, tuple):
                built.append(zeros_of(aval))
            else:
                built.append(np.zeros(()))
        elif isinstance(e, EntryInfo.Ref):
            built.append(built[e.target])
        else:
            children = [built[c] for c in e.children]
            built.append(build_node(e.node_type, e.data, children))
    _, def_, _ = _native.flatten_shared(built[-1])
    rebuilt: list[Any] = def_.node_info()
    same = len(rebuilt) == len(info) and all(
        type(x) is type(y)
        and (
            not isinstance(x, EntryInfo.Node)
            or (x.node_type is y.node_type and x.arity == y.arity and x.children == y.children)
        )
        for x, y in zip(rebuilt, info, strict=True)
    )
    if not same or def_.num_leaves != len(pos):
        raise ValueError(
            see(
                "cond-branches",
                "treeclone: the branches share arrays between places of the operands in different "
                "ways, and the structure could not be rebuilt to hold them apart (a pytree node "
                "whose unflatten does not keep its children); use policy='clone'",
            )
        )
    return def_


def build_node(ty: type, data: Any, children: list) -> Any:
    if ty is list:
        return list(children)
    if ty is tuple:
        return tuple(children)
    if ty is dict:
        return dict(zip(data, children, strict=True))
    if ty is type(None):
        return None
    if issubclass(ty, tuple) and hasattr(ty, "_fields"):
        return ty(*children)
    return unflatten_node(ty, data, children)


def taken_plan(r: BranchRecord) -> Any:
    """The plan of the branch that recorded ``r`` alone, its values read from the joined
    outputs (one per leaf position of the structure every branch shares)."""
    sources: list[Any] = [None] * r.def_.num_leaves
    for p, s in enumerate(r.slots):
        if sources[s] is None:
            given = r.inputs[p]
            sources[s] = Source.Output(index=p) if given is None else Source.Input(slot=given)
    return _native.CallPlan(
        r.def_, sources, r.origins, r.result_child, write_custom, enclosing=r.enclosing
    )


def joined_plan(records: Sequence[BranchRecord]) -> Any:
    """One plan for every branch: a leaf position that holds one operand leaf in every branch
    is handed back, any other comes from the computation; each container's origin joins the
    branches' (``join_origins``)."""
    n_pos = len(records[0].slots)
    # Positions that hold one value in every branch are one class (one output).
    classes: dict[tuple, int] = {}
    rep = []
    for p in range(n_pos):
        key = tuple(r.slots[p] for r in records)
        rep.append(classes.setdefault(key, p))
    chosen = next((r for r in records if len(set(r.slots)) == len(classes)), None)
    if chosen is not None:
        def_, slots = chosen.def_, chosen.slots
    else:
        def_ = refined(records[0])
        slots = [e.slot for e in def_.node_info() if isinstance(e, EntryInfo.Leaf)]
    sources: list[Any] = [None] * def_.num_leaves
    for p in range(n_pos):
        if sources[slots[p]] is not None:
            continue
        given = {r.inputs[p] for r in records}
        slot = given.pop() if len(given) == 1 else None
        if slot is not None:
            sources[slots[p]] = Source.Input(slot=slot)
        else:
            sources[slots[p]] = Source.Output(index=rep[p])
    origins = [join_origins([r.origins[n] for r in records]) for n in range(def_.num_nodes)]
    # Rule J31: any writing branch's check (each names its branch; they share the operands).
    enclosing = next((r.enclosing for r in records if r.enclosing is not None), None)
    return _native.CallPlan(
        def_, sources, origins, records[0].result_child, write_custom, enclosing=enclosing
    )


def first_difference(
    call: Any, layout: Layout, a: BranchRecord, b: BranchRecord, say_ref: Any
) -> tuple[str, str, str] | None:
    """The first place, top down, where two branches' plans differ (other than in which
    leaves they write): ``(key path, what a leaves there, what b leaves there)``. ``call``
    and ``layout``: the operands' (see :class:`PathNamer`); ``say_ref(record, position)``
    names the operand Ref a branch leaves at a leaf position."""
    ia, ib = a.info, b.info
    pos_a = leaf_positions(ia)
    pos_b = leaf_positions(ib)
    paths = PathNamer(call, layout, a)
    other = PathNamer(call, layout, b)
    mapped: dict[int, int] = {}
    agenda = [(len(ia) - 1, len(ib) - 1)]
    while agenda:
        na, nb = agenda.pop()
        ea, eb = ia[na], ib[nb]
        problem = None
        if type(ea) is not type(eb):
            problem = (say(paths, a, na), say(other, b, nb))
        elif isinstance(ea, EntryInfo.Ref):
            if mapped.get(ea.target) != eb.target:
                problem = (say(paths, a, na), say(other, b, nb))
        elif isinstance(ea, EntryInfo.Leaf):
            av_a, av_b = a.avals[pos_a[na]], b.avals[pos_b[nb]]
            if pos_a[na] in a.statics or pos_b[nb] in b.statics:
                problem = static_difference(a, pos_a[na], b, pos_b[nb])
            elif av_a != av_b:
                problem = (say_aval(av_a), say_aval(av_b))
            elif isinstance(av_a, RefAval) and a.inputs[pos_a[na]] != b.inputs[pos_b[nb]]:
                # A Ref is never output: each place keeps the same operand's Ref.
                problem = (say_ref(a, pos_a[na]), say_ref(b, pos_b[nb]))
        else:
            oa, ob = a.origins[na], b.origins[nb]
            if (
                ea.node_type is not eb.node_type
                or ea.arity != eb.arity
                or not same_data(ea.data, eb.data)
                or (oa is None) != (ob is None)
                or (oa is not None and (oa.node != ob.node or oa.writable != ob.writable))
            ):
                keyed = key_difference(ea, eb)
                if keyed is not None:
                    key, in_a = keyed
                    where = paths.path(na) + keystr((DictKey(key),))
                    there, missing = "a value under this key", "no such key"
                    return (where, *((there, missing) if in_a else (missing, there)))
                problem = (say(paths, a, na), say(other, b, nb))
            elif oa is not None and keys_moved(oa) != keys_moved(ob):
                problem = (say_order(oa), say_order(ob))
        if problem is not None:
            return (paths.path(na), *problem)
        mapped[na] = nb
        if isinstance(ea, EntryInfo.Node):
            agenda.extend(reversed(list(zip(ea.children, eb.children, strict=True))))
    return None
