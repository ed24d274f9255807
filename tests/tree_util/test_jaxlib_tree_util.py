"""treeclone.jaxlib_tree_util: treeclone.tree_util with jaxlib's treedefs, for code that checks
``isinstance(t, jax.tree_util.PyTreeDef)`` (equinox's jaxtyping annotations, libraries' own
checks). Differential against jax.tree_util, and a real equinox training step run with
jax.tree_util's functions replaced by this namespace's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
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


def test_equinox_training_step_with_jax_tree_util_replaced(monkeypatch):
    eqx = pytest.importorskip("equinox")
    optax = pytest.importorskip("optax")

    def train(steps: int) -> tuple[list[float], list[np.ndarray]]:
        model = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.PRNGKey(0))
        opt = optax.adam(1e-2)
        state = opt.init(eqx.filter(model, eqx.is_inexact_array))
        x, y = jnp.ones((16, 4)), jnp.zeros((16, 2))

        @eqx.filter_jit
        def step(model, state):
            def loss(m):
                return jnp.mean((jax.vmap(m)(x) - y) ** 2)

            value, grads = eqx.filter_value_and_grad(loss)(model)
            updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
            return eqx.apply_updates(model, updates), state, value

        losses = []
        for _ in range(steps):
            model, state, value = step(model, state)
            losses.append(float(value))
        return losses, [np.asarray(a) for a in jtu.tree_leaves(eqx.filter(model, eqx.is_array))]

    expected = train(3)
    for name in jl.__all__:
        monkeypatch.setattr(jtu, name, getattr(jl, name))
    got = train(3)
    assert got[0] == expected[0]
    for a, b in zip(got[1], expected[1], strict=True):
        np.testing.assert_array_equal(a, b)
