"""The registered flatten functions that the Rust core runs natively (``rust/node/known.rs``),
recognised for :func:`treeclone._jax_compat.classify_type`: ``jax.tree_util.register_dataclass``'s
(by the field names it closes over), flax nnx's (by identity) and the one equinox generates
for a Module (by its code). Each reads the internals of the library that made the function;
any doubt is a no, and the function is then called as any other.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

from treeclone._native import TypeKind


def dataclass_fields(flatten: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """``(data_fields, meta_fields)`` of a flatten function ``jax.tree_util.register_dataclass``
    made (the names it closes over), which the core runs natively (``rust/node/known.rs``,
    checked there against the function on the first node); None for any other function."""
    if getattr(flatten, "__qualname__", None) != "register_dataclass.<locals>.flatten_func":
        return None
    try:
        cells = flatten.__code__.co_freevars, flatten.__closure__ or ()
        names = {name: cell.cell_contents for name, cell in zip(*cells, strict=True)}
    except (AttributeError, ValueError):  # not a plain function, or an empty cell
        return None
    data, meta = names.get("data_fields"), names.get("meta_fields")
    if not (isinstance(data, tuple) and isinstance(meta, tuple)):
        return None
    if not all(type(name) is str for name in (*data, *meta)):
        return None
    return data, meta


def custom_kind(flatten: Any) -> TypeKind:
    """``TypeKind.Custom``, or the kind that says ``flatten`` is one of flax nnx's flatten
    functions, which the core runs natively (``rust/node/known.rs``). Recognised by identity,
    and only where flax is already imported (its nodes cannot exist otherwise)."""
    pytreelib = sys.modules.get("flax.nnx.pytreelib")
    pytree = getattr(pytreelib, "Pytree", None)
    if pytree is not None and flatten is getattr(pytree, "_pytree__flatten", None):
        return TypeKind.NnxPytree
    if pytreelib is not None and flatten is getattr(pytreelib, "_flatten_pytree_state", None):
        return TypeKind.NnxPytreeState
    variablelib = sys.modules.get("flax.nnx.variablelib")
    if variablelib is not None and flatten is getattr(variablelib, "_variable_flatten", None):
        return TypeKind.NnxVariable
    statelib = sys.modules.get("flax.nnx.statelib")
    if statelib is not None and flatten is getattr(statelib, "_state_flatten", None):
        return TypeKind.NnxState
    return TypeKind.Custom


def equinox_flatten(ty: type, flatten: Any) -> bool:
    """Whether ``flatten`` is the function equinox generates to flatten its Module ``ty``,
    which reads nothing but ``obj.__dict__`` (its fields, by ``get``, and its length), so that
    ``jit_partial``'s watch of the instance dict and the class stands for it (docs/semantics.md,
    "jit_partial"): its code is that of the function equinox generates for ``ty`` now, the
    names it reads are equinox's own, and the class reads ``__dict__`` the plain way (through
    ``object``'s or equinox's ``__getattribute__``, which passes magic names through). Any
    doubt (no equinox, another release's helpers, an error) is a no: the flatten then runs
    again at each check."""
    module = sys.modules.get("equinox._module._flatten")
    generate = getattr(module, "generate_flatten_functions", None)
    code, names = getattr(flatten, "__code__", None), getattr(flatten, "__globals__", None)
    if generate is None or code is None or not isinstance(names, dict):
        return False
    if names.get("MISSING") is not getattr(module, "MISSING", None) or "len" in names:
        return False
    # equinox's Module.__getattribute__ hands `__dict__` (a magic name) over unchanged.
    module_class = getattr(sys.modules.get("equinox._module._module"), "Module", None)
    plain = (object.__getattribute__, getattr(module_class, "__getattribute__", None))
    if not any(ty.__getattribute__ is g for g in plain):
        return False
    slot = next((k.__dict__["__dict__"] for k in ty.__mro__ if "__dict__" in k.__dict__), None)
    if type(slot) is not types.GetSetDescriptorType:
        return False
    try:
        expected = generate(ty, dataclasses.fields(ty))[0]
    except Exception:  # noqa: BLE001 - any failure means "not recognised"
        return False
    return getattr(expected, "__code__", None) == code
