"""Type stubs for treeclone's Rust core (see rust/)."""

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NoReturn, final

__version__: str

@final
class PyTreeDef:
    """A pytree's structure: equal to JAX's ``PyTreeDef`` of the same tree."""

    @property
    def num_leaves(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    def unflatten(self, leaves: Iterable[Any]) -> Any: ...
    def flatten_up_to(self, tree: Any) -> list[Any]: ...
    def children(self) -> list[PyTreeDef]: ...
    def node_data(self) -> tuple[type, Any] | None: ...
    def compose(self, inner: PyTreeDef | Any) -> PyTreeDef: ...
    def to_jax(self) -> Any: ...
    @staticmethod
    def from_jax(treedef: Any) -> PyTreeDef: ...
    def walk(
        self, f_node: Callable[[Any, Any], Any], f_leaf: Callable[[Any], Any], leaves: Iterable[Any]
    ) -> Any: ...
    def from_iterable_tree(self, tree: Any) -> Any: ...
    def serialize_using_proto(self) -> bytes: ...
    @staticmethod
    def deserialize_using_proto(registry: Any, data: bytes) -> PyTreeDef: ...
    @staticmethod
    def from_node_data_and_children(
        registry: Any, node_data: tuple[type, Any] | None, children: Iterable[PyTreeDef | Any]
    ) -> PyTreeDef: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def unflatten_floor(treedef: PyTreeDef, leaves: list[Any], /) -> Any:
    """treedef.unflatten(leaves) by the shortest path: the tree benchmark's floor."""

def flatten(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> tuple[list[Any], PyTreeDef]: ...
def check(tree: Any, name: str | None = None) -> None:
    """Raise what ``flatten(tree)`` would raise (a cycle, a bad flatten result), recording
    nothing; ``name`` names the tree's root in a cycle's message."""

def check_arguments(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    static_nums: frozenset[int],
    static_names: frozenset[str],
) -> None:
    """Raise what ``check((args, kwargs))`` would raise, the static arguments left out:
    positions in ``static_nums`` (a negative one counts from the end) and keywords in
    ``static_names``."""

def tree_unflatten(treedef: Any, leaves: Iterable[Any]) -> Any: ...
def leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]: ...
def structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> PyTreeDef: ...
def flatten_with_path(
    tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
) -> tuple[list[tuple[tuple[Any, ...], Any]], PyTreeDef]: ...
def tree_map(
    f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None
) -> Any: ...
def treedef_tuple(treedefs: list[PyTreeDef | Any]) -> PyTreeDef: ...
def is_leaf_object(x: Any) -> bool: ...
def invalidate_registry_cache() -> None: ...
def clear_key_order_cache() -> None: ...
def check_jax() -> None: ...
def _treedef_from_state(state: list[Any]) -> PyTreeDef: ...
def cpython_internals() -> tuple[Literal["on", "switched off", "unverified"], str | None]: ...

class TypeKind:
    """What ``classify_type`` says a type is (list, tuple, dict and None are known natively)."""

    Leaf: TypeKind
    NamedTuple: TypeKind
    Custom: TypeKind
    NnxPytree: TypeKind
    NnxVariable: TypeKind
    NnxPytreeState: TypeKind
    NnxState: TypeKind
    Dataclass: TypeKind
    EqxModule: TypeKind

class EntryInfo:
    """One entry of a ``SharedTreeDef`` (``node_info()``), in post-order."""

    class Leaf(EntryInfo):
        @property
        def slot(self) -> int: ...

    class Ref(EntryInfo):
        @property
        def target(self) -> int: ...

    class Node(EntryInfo):
        @property
        def node_type(self) -> type: ...
        @property
        def arity(self) -> int: ...
        @property
        def data(self) -> Any: ...
        @property
        def size(self) -> int: ...
        @property
        def children(self) -> list[int]: ...

@final
class SharedTreeDef:
    """A pytree's structure with its sharing: which leaves and containers are one object."""

    @property
    def num_leaves(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    def unflatten(self, leaves: list[Any]) -> Any: ...
    def unflatten_nodes(self, leaves: list[Any]) -> tuple[Any, list[Any]]: ...
    def node_info(self) -> list[EntryInfo.Leaf | EntryInfo.Ref | EntryInfo.Node]: ...
    def children_of(self, i: int) -> list[int]: ...
    def child_slots(self, i: int) -> list[list[int]]: ...
    @staticmethod
    def join_tuples(a: SharedTreeDef, b: SharedTreeDef) -> SharedTreeDef: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Snapshot:
    """The contents, by identity, of the containers among some objects (jit_partial)."""

    @staticmethod
    def take(objects: list[Any], sdef: SharedTreeDef, leaves: list[Any]) -> Snapshot: ...
    @staticmethod
    def flatten_and_take(
        tree: Any,
    ) -> tuple[list[Any], SharedTreeDef, list[Any], Snapshot]: ...
    def refresh(self, nodes: Sequence[int], leaves: list[Any]) -> None: ...
    def unchanged(self) -> bool: ...
    def release(self, nodes: Sequence[int]) -> None: ...
    @property
    def checkable(self) -> bool: ...
    @property
    def flattened_at_each_check(self) -> int:
        """How many registered nodes each ``unchanged`` flattens again (one level): those whose
        flatten may read more than is watched (docs/semantics.md, "jit_partial")."""

def running_call() -> Any:
    """The call running now in this thread (a ``JitCall`` or a lean call's record), or None."""

def swap_running_call(call: Any) -> Any:
    """Put ``call`` in this thread's running-call slot; returns what it held."""

class FlattenFailed(ValueError):
    """A native call's arguments could not be flattened (or differ from a stage's): Python
    words the error, naming the argument."""

class ShardedArguments(FlattenFailed):
    """A call's arguments are on a mesh and its key holds no shardings: the call is made again
    with them in its key (``_jit.placement``), and so are the later ones."""

class JitCore:
    """The native base of ``treeclone.Jitted``: its ``__call__``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def _init_core(
        self,
        policy: Any,
        clone: Any,
        policy_override: Any,
        jax_jitted: Any,
        static_nums: frozenset[int],
        static_names: frozenset[str],
    ) -> None: ...
    def _lean_for(self, policy: Any) -> LeanCall: ...
    def _release_held(self) -> None: ...
    def _kept(self) -> Any: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class PartialCore:
    """The native base of ``treeclone.JitPartial``: its ``__call__``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def _init_partial(self, jitted: JitCore, bound: tuple[Any, ...], arguments: Any) -> None: ...
    def _set_replaced(self, replaced: bool) -> None: ...
    def _call_checked(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...
    def _checked(self, policy: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

@final
class ResultBox:
    """The inner jit's result: its outputs, with the trace's ``JitRecord`` as static data."""

    def __new__(cls, info: Any, leaves: Any) -> ResultBox: ...
    @property
    def info(self) -> Any: ...
    @property
    def leaves(self) -> Any: ...

class LeanCall:
    """``treeclone.jit``'s whole call under a policy other than ``clone`` (or with ``traced=``):
    the native call, Python only on a cache miss (``key_of``) and on the error paths."""

    def __init__(
        self,
        inner: Any,
        jitted: Any,
        keys: dict[Any, tuple[Any, ...]],
        key_of: Callable[..., tuple[Any, ...]],
        tracer: type,
        finish: Callable[[tuple[Any, ...], Any, Any], Any],
        array: type,
        statics: StaticArguments | None = None,
        traced: Callable[[Any], bool] | None = None,
        by_type: bool = False,
        keyed: bool = False,
    ) -> None: ...
    def prepare(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], bound: Any = None, keyed: bool = False
    ) -> tuple[Any, ...]:
        """What a call of these arguments hands its inner jit, as the running call's record:
        ``(inner, jitted, key, leaves, objects, args, kwargs, positions)``."""

class StageCall:
    """Calling a traced or compiled stage: the jitted call with the stage in place of the
    inner jit, for calls of its key under its policy; ``refuse(args, kwargs)`` raises the
    error of any other call. ``made``: ``(stage, key, keyed)``; ``policies``: ``(made under,
    the wrapper's own, policy_override.get)``; ``fixed``: the static values by position and
    by keyword; ``bound``: ``jit_partial``'s ``(bound arguments, BoundArguments,
    JitPartial)``."""

    def __init__(
        self,
        lean: LeanCall,
        made: tuple[Any, tuple[Any, ...], bool],
        policies: tuple[Any, Any, Callable[[], Any]],
        fixed: tuple[list[tuple[int, Any]], dict[str, Any]],
        refuse: Callable[[tuple[Any, ...], dict[str, Any] | None], NoReturn],
        bound: tuple[tuple[Any, ...], Any, Any] | None = None,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class StaticArguments:
    """How a ``treeclone.jit`` call's static arguments are taken out and keyed by the native
    call: ``static_argnums`` (negative ones count from the end),
    ``static_argnames``, and ``hash_static(value)``, which raises jax.jit's error for a value
    that cannot be hashed."""

    def __new__(
        cls, nums: frozenset[int], names: frozenset[str], hash_static: Callable[[Any], None]
    ) -> StaticArguments: ...

class Source:
    """Where a result leaf comes from: the caller's input slot or the computation's output."""

    class Input(Source):
        def __init__(self, slot: int) -> None: ...
        @property
        def slot(self) -> int: ...

    class Output(Source):
        def __init__(self, index: int) -> None: ...
        @property
        def index(self) -> int: ...

class Origin:
    """The caller's container a result node is (for write-back)."""

    def __init__(
        self,
        *,
        node: int,
        old_children: list[int],
        same_data: bool,
        writable: bool,
        key_order: tuple[Any, ...] | None = None,
        reordered: bool = True,
        attrs: Any = None,
        direct: list[tuple[str, int]] | None = None,
        by_entry: bool = False,
        old_keys: tuple[Any, ...] | None = None,
    ) -> None: ...
    node: int
    old_children: list[int]
    same_data: bool
    writable: bool
    key_order: tuple[Any, ...] | None
    by_entry: bool
    old_keys: tuple[Any, ...] | None

class CallPlan:
    """What a traced call returns and writes back, applied at every call."""

    def __init__(
        self,
        def_: SharedTreeDef,
        sources: list[Source],
        origins: list[Origin | None],
        result_child: int | None,
        write_custom: Callable[[Any, Any, tuple[str, ...] | None], Callable[[], None]],
        input_def: SharedTreeDef | None = None,
        enclosing: Callable[
            [list[Any], list[Any], Sequence[Any], list[tuple[int, tuple[Any, ...]]]], None
        ]
        | None = None,
    ) -> None: ...
    def apply(
        self, input_leaves: list[Any], input_objects: list[Any], outputs: list[Any]
    ) -> Any: ...

def flatten_shared(tree: Any) -> tuple[list[Any], SharedTreeDef, list[Any]]: ...
def any_identical(these: list[Any], those: list[Any]) -> bool: ...
def bound_join(
    bound: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[Any], SharedTreeDef, list[Any]]: ...
def bound_advance(bound: Any, next_inputs: Any, leaves: list[Any], outputs: Any) -> None: ...

@final
class Taker:
    def __new__(cls, indices: Sequence[int]) -> Taker: ...
    def __call__(self, first: list[Any], second: list[Any] | tuple[Any, ...]) -> list[Any]: ...
    def __len__(self) -> int: ...
