"""Container kinds the write-back tests share, each registered with ``jax.tree_util``.

- ``MyDict`` / ``MyList``: a dict and a list subclass registered as nodes;
- ``Model``: a registered class with state its flatten does not carry (``history``);
- ``ModelCopy``: a subclass of ``Model`` registered the same way (``__class__`` reassigned
  between the two changes nothing but the type);
- ``Noted``: a dataclass registered with a ``drop_fields`` field (``note``);
- ``Stored``: a registered class whose flatten reads its child from a plain dict held in an
  attribute (``self._store["w"]``), which is not a node of the tree;
- ``Scaled``: a registered class whose aux data is an attribute (``scale``).
"""

from __future__ import annotations

import dataclasses

import jax
from helpers import drop_fields_arg


class MyDict(dict):
    """A dict subclass registered as a node: children in insertion order, keys as aux data."""


jax.tree_util.register_pytree_node(
    MyDict,
    lambda d: (list(d.values()), list(d.keys())),
    lambda keys, values: MyDict(zip(keys, values, strict=True)),
)


class MyList(list):
    """A list subclass registered as a node."""


jax.tree_util.register_pytree_node(MyList, lambda xs: (list(xs), None), lambda _, c: MyList(c))


@jax.tree_util.register_pytree_node_class
class Model:
    """A registered class with state its flatten does not carry (``history``)."""

    def __init__(self, w):
        self.w = w
        self.history = []

    def tree_flatten(self):
        return (self.w,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@jax.tree_util.register_pytree_node_class
class ModelCopy(Model):
    """``Model`` under another name, registered the same way."""


class Stored:
    """Its child lives in a plain dict held by an attribute, read there by its flatten."""

    def __init__(self, w):
        self._store = {"w": w}


jax.tree_util.register_pytree_node(
    Stored, lambda s: ((s._store["w"],), None), lambda _, children: Stored(children[0])
)


@dataclasses.dataclass
class Noted:
    """A dataclass whose ``note`` its flatten drops: write-back must leave it alone."""

    x: object
    note: str = "default"


jax.tree_util.register_dataclass(
    Noted, data_fields=["x"], meta_fields=[], drop_fields=drop_fields_arg(["note"])
)


@jax.tree_util.register_pytree_node_class
class Scaled:
    """``scale`` is static (aux) data."""

    def __init__(self, w, scale):
        self.w, self.scale = w, scale

    def tree_flatten(self):
        return (self.w,), self.scale

    @classmethod
    def tree_unflatten(cls, scale, children):
        return cls(children[0], scale)
