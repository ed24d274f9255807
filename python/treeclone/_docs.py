"""Where a message of treeclone's own reads more: its entry in the documentation site's
"Errors and warnings" page (``docs/site/errors.md``, built as ``errors.html``).

Every error and warning treeclone raises with a message of its own ends with the pointer
``(treeclone docs: errors.html#ANCHOR)``, appended by :func:`see`; the anchors are the entries
below, one per kind, each a ``(ANCHOR)=`` target of the page (``tests/test_docs_site.py``
checks both ways, and that every such raise calls :func:`see`). Messages that treeclone writes
as JAX writes them (where it stands in for a JAX function) carry none.

>>> from treeclone._docs import see
>>> see("mutation-error", "f mutated its inputs.")
'f mutated its inputs. (treeclone docs: errors.html#mutation-error)'
"""

from __future__ import annotations

# anchor -> the entry's title (what the page's heading says).
ENTRIES: dict[str, str] = {
    "mutation-error": "MutationError: an input changed in place and not returned (strict)",
    "mutation-warning": "MutationWarning: changes that clone discards",
    "retrace-warning": "RetraceWarning: traced again at every call",
    "unsupported-jax": "UnsupportedJaxError: a JAX release without what treeclone reads",
    "not-a-jax-type": "TypeError: a leaf that is not a JAX type",
    "unhashable-static-leaf": "TypeError: a static leaf that is not hashable",
    "not-differentiable": "TypeError: a differentiated leaf that cannot be",
    "invalid-option": "ValueError / TypeError: an invalid policy, traced=, wrt= or setting",
    "policy-argument": "ValueError / TypeError: a policy dict naming no argument",
    "one-container-two-policies": "ValueError: one container under two policies",
    "changed-elsewhere": "ValueError: an argument changed through another name",
    "attribute-not-carried": "ValueError: an attribute its flatten does not carry",
    "traced-static-data": "ValueError: a traced value in static data",
    "consumed-state": "ValueError: a consumed State with nothing in its place",
    "jax-transformation-inside": "ValueError: an in-place change inside JAX's own transformation",
    "loop-carry": "ValueError / TypeError: a loop's carry changed shape, type or place",
    "loop-slice": "ValueError / TypeError: a scan body's slice of xs",
    "cond-branches": "ValueError: cond/switch branches that leave different structures",
    "vmap-axes": "ValueError: one object given two batch axes",
    "vmap-write-back": "ValueError: a vmap value that cannot be written back",
    "one-array-two-shardings": "ValueError: one array given two shardings",
    "shard-map-write-back": "ValueError / TypeError: a shard_map write-back without its spec",
    "jit-partial": "ValueError: jit_partial's policy and bound arguments",
    "aot-stage": "TypeError: an ahead-of-time stage called with other arguments",
    "cyclic-tree": "ValueError: a cycle or a tree nested too deep",
}


def see(anchor: str, text: str) -> str:
    """``text`` with the pointer to the entry ``anchor`` of the errors page (a KeyError for an
    anchor that is no entry: a typo would send the user nowhere)."""
    if anchor not in ENTRIES:
        raise KeyError(f"no entry {anchor!r} in treeclone._docs.ENTRIES")
    return f"{text} (treeclone docs: errors.html#{anchor})"
