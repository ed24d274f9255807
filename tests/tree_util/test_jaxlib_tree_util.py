"""treeclone.jaxlib_tree_util: treeclone.tree_util with jaxlib's treedefs, for code that checks
``isinstance(t, jax.tree_util.PyTreeDef)`` (equinox's jaxtyping annotations, libraries' own
checks). Differential against jax.tree_util; real optax, equinox and flax nnx steps run with
jax.tree_util replaced by this namespace are in test_library_drop_in.py."""

from __future__ import annotations

import jax.tree_util as jtu
import pytest
import treeclone.jaxlib_tree_util as jl
import treeclone.tree_util as tc
from trees import BIG_IDS, CORPUS_BY_ID, CORPUS_IDS

TREE_IDS = [i for i in CORPUS_IDS if i not in BIG_IDS]
JAXLIB_OWN = {
    "PyTreeDef",
    "tree_flatten",
    "tree_flatten_with_path",
    "tree_structure",
    "tree_transpose",
    "treedef_children",
    "treedef_tuple",
}


def test_names_are_jax_tree_utils_and_each_comes_from_the_right_side():
    public = {name for name in dir(jtu) if not name.startswith("_")}
    assert set(jl.__all__) == set(tc.__all__) == public
    for name in jl.__all__:
        expected = getattr(jtu, name) if name in JAXLIB_OWN else getattr(tc, name)
        assert getattr(jl, name) is expected, name


@pytest.mark.parametrize("corpus_id", TREE_IDS)
def test_treedefs_are_jaxlibs_and_round_trip(corpus_id):
    tree = CORPUS_BY_ID[corpus_id]()
    leaves, treedef = jl.tree_flatten(tree)
    assert isinstance(treedef, jtu.PyTreeDef)
    assert treedef == jtu.tree_structure(tree)
    assert leaves == jtu.tree_leaves(tree)
    rebuilt = jl.tree_unflatten(treedef, leaves)
    assert jtu.tree_structure(rebuilt) == treedef
    assert jtu.tree_leaves(rebuilt) == leaves


def test_treeclone_tree_util_treedefs_are_not_jaxlib_instances():
    """Why the namespace exists: treeclone's fast treedefs equal jaxlib's but are another type."""
    ours = tc.tree_structure({"a": 1})
    assert ours == jtu.tree_structure({"a": 1})
    assert not isinstance(ours, jtu.PyTreeDef)


def test_jaxtyping_pytreedef_annotation_accepts_its_treedefs():
    """What equinox's annotations check at run time (jaxtyping's PyTreeDef is jaxlib's class)."""
    jaxtyping = pytest.importorskip("jaxtyping")
    assert isinstance(jl.tree_structure({"a": [1]}), jaxtyping.PyTreeDef)
    assert not isinstance(tc.tree_structure({"a": [1]}), jaxtyping.PyTreeDef)
