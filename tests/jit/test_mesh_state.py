"""In-place state on a mesh (issue 48): arrays written back keep the sharding of the arrays they
replace, and a returned input stays the caller's object under ``out_shardings``.

An optax AdamW step updates a state dict in place; the state is placed on 8 CPU devices, on a
1-D mesh (``data=8``) and on a 2-D one (``data=4 x model=2``, ``w1`` sharded
``P(None, "model")``), and stepped 10 times under every variant: ``treeclone.jit`` (alias
without and with returning the state, strict, a policy per argument, donation), ``jit_partial``
and ``treeclone.jit(alias)`` over ``treeclone.shard_map(alias)``. The reference is the same
step written functionally under ``jax.jit`` with ``out_shardings`` naming every leaf's initial
sharding (and ``donate_argnums``): after each step, every leaf of the caller's state must have
the reference's sharding (its initial one) and values, and the caller's containers must be the
ones it had (a returned state its own). Each case runs on the kinds of mesh JAX makes
(``tests/support/meshes.py``: ``Mesh``, ``jax.make_mesh`` with Auto, Explicit or both kinds of
axes, made current by ``jax.set_mesh`` or ``with mesh:``; ``ON_KIND`` says which where), and a
written-back array that its old sharding no longer fits is placed as jax.jit places it
(``check_rank_change``). Run in a subprocess (``XLA_FLAGS`` must be set before JAX is
imported), as ``test_jit_sharding`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import meshes
import numpy as np
import pytest
from helpers import check_answer, run_all_on_cpu_devices

NUM_DEVICES = 8
STEPS = 10

# --- the model and its step (run in the subprocess) -------------------------------------------


class Mesh:
    """A mesh of a kind (``tests/support/meshes.py``), the shardings of the state on it, and
    the state and batch placed."""

    def __init__(self, shape: tuple[int, ...], kind: str):
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        names = ("data", "model")[: len(shape)]
        self.mesh = meshes.make(kind, shape, names)
        self.model_axis = names[-1]
        self.spec = {"w1": P(None, self.model_axis), "b1": P(), "w2": P()}
        self.sharding = lambda spec: NamedSharding(self.mesh, spec)
        self.repl = self.sharding(P())
        self.batch = self.sharding(P("data"))


def _params() -> dict[str, jax.Array]:
    rng = np.random.default_rng(0)
    return {
        "w1": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
        "b1": jnp.zeros((16,), jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(16, 4)), jnp.float32) * 0.1,
    }


def _loss(params: dict, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"]) ** 2)


def _optimizer() -> Any:
    import optax

    return optax.adamw(1e-2)


def new_state(m: Mesh) -> dict:
    """The state ``{"params", "opt", "step"}``, every leaf committed: the parameters (and
    their moments) as ``m.spec`` says, the rest replicated."""
    params = _params()
    opt = _optimizer().init(params)
    state = {"params": params, "opt": opt, "step": jnp.zeros((), jnp.int32)}
    return jax.device_put(state, state_shardings(m, state))


def state_shardings(m: Mesh, state: dict) -> dict:
    """Each leaf's sharding: a leaf under a parameter's name gets its spec."""

    def pick(path: tuple, _: Any) -> Any:
        for entry in reversed(path):
            key = getattr(entry, "key", None)
            if key in m.spec:
                return m.sharding(m.spec[key])
        return m.repl

    return jax.tree_util.tree_map_with_path(pick, state)


def batch(m: Mesh, i: int) -> jax.Array:
    x = np.random.default_rng(100 + i).normal(size=(32, 8)).astype(np.float32)
    return jax.device_put(x, m.batch)


def step_in_place(state: dict, x: jax.Array) -> jax.Array:
    """The step as plain Python writes it: the state dict updated in place."""
    import optax

    loss, grads = jax.value_and_grad(_loss)(state["params"], x)
    updates, state["opt"] = _optimizer().update(grads, state["opt"], state["params"])
    state["params"] = optax.apply_updates(state["params"], updates)
    state["step"] = state["step"] + 1
    return loss


def step_returning(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
    return state, step_in_place(state, x)


def functional_step(state: dict, x: jax.Array) -> tuple[dict, jax.Array]:
    """The reference's step: a new state, as jax.jit users write it."""
    state = dict(state)
    loss = step_in_place(state, x)
    return state, loss


# --- the variants (each returns a function ``run(state, x)`` stepping the caller's state) -------


def _reference(m: Mesh, state: dict) -> Callable:
    shardings = state_shardings(m, state)
    return jax.jit(functional_step, out_shardings=(shardings, m.repl), donate_argnums=0)


def v_alias(m: Mesh, state: dict, tc: Any) -> Callable:
    return tc.jit(step_in_place, policy="alias")


def v_alias_returning(m: Mesh, state: dict, tc: Any) -> Callable:
    jitted = tc.jit(step_returning, policy="alias")

    def run(st: dict, x: jax.Array) -> jax.Array:
        out, loss = jitted(st, x)
        assert out is st, "the returned state is not the caller's dict"
        return loss

    return run


def v_alias_out_shardings(m: Mesh, state: dict, tc: Any) -> Callable:
    """out_shardings naming the returned state's leaves: the caller's dict comes back."""
    out = (state_shardings(m, state), m.repl)
    jitted = tc.jit(step_returning, policy="alias", out_shardings=out)

    def run(st: dict, x: jax.Array) -> jax.Array:
        back, loss = jitted(st, x)
        assert back is st, "out_shardings: the returned state is not the caller's dict"
        return loss

    return run


def v_alias_donated(m: Mesh, state: dict, tc: Any) -> Callable:
    jitted = tc.jit(step_in_place, policy="alias", donate_argnums=0)

    def run(st: dict, x: jax.Array) -> jax.Array:
        old = jax.tree_util.tree_leaves(st)
        loss = jitted(st, x)
        assert all(a.is_deleted() for a in old), "a donated array was not deleted"
        return loss

    return run


def v_strict(m: Mesh, state: dict, tc: Any) -> Callable:
    jitted = tc.jit(step_returning, policy="strict")

    def run(st: dict, x: jax.Array) -> jax.Array:
        new, loss = jitted(st, x)
        st.clear()
        st.update(new)  # strict hands back a new state: the caller keeps it in its dict
        return loss

    return run


def v_per_argument(m: Mesh, state: dict, tc: Any) -> Callable:
    return tc.jit(step_in_place, policy={"state": "alias", ...: "clone"})


def v_jit_partial(m: Mesh, state: dict, tc: Any) -> Callable:
    bound = tc.jit_partial(step_in_place, state, policy="alias")
    return lambda st, x: bound(x)


def v_jit_partial_donated(m: Mesh, state: dict, tc: Any) -> Callable:
    bound = tc.jit_partial(step_in_place, state, policy="alias", donate_argnums=0)
    return lambda st, x: bound(x)


def v_shard_map(m: Mesh, state: dict, tc: Any) -> Callable:
    """The whole step per device under ``treeclone.shard_map(alias)`` (the state replicated
    in it, the batch split over ``data``, the gradients averaged with ``pmean``), inside
    ``treeclone.jit(alias)``: the shard_map writes the state back replicated, the jit keeps
    each leaf's own sharding."""
    from jax.sharding import PartitionSpec as P

    def local(st: dict, x: jax.Array) -> jax.Array:
        import optax

        loss, grads = jax.value_and_grad(_loss)(st["params"], x)
        grads = jax.lax.pmean(grads, "data")
        updates, st["opt"] = _optimizer().update(grads, st["opt"], st["params"])
        st["params"] = optax.apply_updates(st["params"], updates)
        st["step"] = st["step"] + 1
        return jax.lax.pmean(loss, "data")

    sharded = tc.shard_map(
        local,
        mesh=m.mesh,
        in_specs=(P(), P("data")),
        out_specs=P(),
        check_vma=False,
        policy="alias",
    )
    return tc.jit(lambda st, x: sharded(st, x), policy="alias")


VARIANTS = {name[2:]: fn for name, fn in dict(globals()).items() if name.startswith("v_")}
MESHES = {"1d": (8,), "2d": (4, 2)}


def _paths(tree: Any) -> dict[str, Any]:
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _same_sharding(a: Any, b: Any, ndim: int) -> bool:
    return a == b or a.is_equivalent_to(b, ndim)


def check_variant(mesh: str, kind: str, variant: str) -> str | None:
    """None when ``STEPS`` steps of ``variant`` keep every leaf where the reference keeps it,
    with the reference's values, on the caller's own containers; else what differs."""
    import treeclone as tc

    m = Mesh(MESHES[mesh], kind)
    state, expected = new_state(m), new_state(m)
    initial = {k: x.sharding for k, x in _paths(state).items()}
    reference = _reference(m, expected)
    run = VARIANTS[variant](m, state, tc)
    top, opt_type = id(state), type(state["opt"])
    for i in range(STEPS if kind == "Mesh" else STEPS_ELSEWHERE):
        x = batch(m, i)
        loss = run(state, x)
        expected, want = reference(expected, x)
        if id(state) != top or type(state["opt"]) is not opt_type:
            return f"step {i}: the caller's state is not its own dict any more"
        got, ref = _paths(state), _paths(expected)
        if got.keys() != ref.keys():
            return f"step {i}: key paths {sorted(got)} != {sorted(ref)}"
        for path, x_got in got.items():
            x_ref = ref[path]
            if not _same_sharding(x_got.sharding, initial[path], x_got.ndim):
                return (
                    f"step {i}: {path} is placed at {x_got.sharding}, it started at "
                    f"{initial[path]} (jax.jit with out_shardings: {x_ref.sharding})"
                )
            if not np.allclose(np.asarray(x_got), np.asarray(x_ref), rtol=1e-5, atol=1e-6):
                return f"step {i}: {path} differs from jax.jit's"
        if not np.allclose(np.asarray(loss), np.asarray(want), rtol=1e-5, atol=1e-6):
            return f"step {i}: the loss differs from jax.jit's"
    return None


def check_opt_out(mesh: str, kind: str) -> str | None:
    """``keep_shardings=False``: XLA places what is written back, as jax.jit without
    out_shardings places its outputs."""
    import treeclone as tc

    m = Mesh(MESHES[mesh], kind)
    state, expected = new_state(m), new_state(m)
    x = batch(m, 0)
    tc.jit(step_in_place, policy="alias", keep_shardings=False)(state, x)
    expected, _ = jax.jit(functional_step)(expected, x)
    got, ref = _paths(state), _paths(expected)
    for path, x_got in got.items():
        if not _same_sharding(x_got.sharding, ref[path].sharding, x_got.ndim):
            return f"{path} is placed at {x_got.sharding}, jax.jit's at {ref[path].sharding}"
    return None


def check_clone(mesh: str, kind: str) -> str | None:
    """Under ``clone`` (``jax.jit``'s own call) nothing is written back and nothing is pinned:
    the functional step's state is placed as ``jax.jit`` without ``out_shardings`` places it,
    step after step, with its values."""
    import treeclone as tc

    m = Mesh(MESHES[mesh], kind)
    state, expected = new_state(m), new_state(m)
    ours, theirs = tc.jit(functional_step), jax.jit(functional_step)
    for i in range(3):
        x = batch(m, i)
        state, _ = ours(state, x)
        expected, _ = theirs(expected, x)
        ref = _paths(expected)
        for path, x_got in _paths(state).items():
            if not _same_sharding(x_got.sharding, ref[path].sharding, x_got.ndim):
                return f"step {i}: {path} is at {x_got.sharding}, jax.jit's {ref[path].sharding}"
            if not np.array_equal(np.asarray(x_got), np.asarray(ref[path])):
                return f"step {i}: {path} differs from jax.jit's"
    return None


def check_lean_path(mesh: str, kind: str) -> str | None:
    """A state on a mesh keeps the native call (``_native.LeanCall``): its calls are keyed on
    their placements there too (the first call's trace begun again with them), with one trace
    in all for ``jit`` and ``jit_partial``, and no call is handed back to Python as one whose
    arguments cannot be flattened (``CallShape.refuse``)."""
    import sys

    import treeclone as tc

    call_module = sys.modules["treeclone._jit.call"]
    refused: list[int] = []
    original = call_module.CallShape.refuse

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        refused.append(1)
        return original(self, *args, **kwargs)

    m = Mesh(MESHES[mesh], kind)
    state = new_state(m)
    traces: list[int] = []

    def step(st: dict, x: jax.Array) -> jax.Array:
        traces.append(1)
        return step_in_place(st, x)

    call_module.CallShape.refuse = counted
    try:
        jitted = tc.jit(step, policy="alias")
        for i in range(5):
            jitted(state, batch(m, i))
        bound = tc.jit_partial(step, state, policy="alias")
        for i in range(5):
            bound(batch(m, i))
    finally:
        call_module.CallShape.refuse = original
    # jit_partial of the same function shares jit's trace, as jit(step) written twice does.
    if refused or len(traces) != 1:
        return f"{len(refused)} calls were handed back, {len(traces)} traces (1 expected)"
    return None


def check_placement_change(mesh: str, kind: str) -> str | None:
    """The caller places its state otherwise between two calls (same structure and mesh): the
    arrays written back follow the new placement, not the first call's, and the trace again
    is explained by key path."""
    import logging

    import treeclone as tc
    from jax.sharding import PartitionSpec as P

    m = Mesh(MESHES[mesh], kind)
    state = new_state(m)
    step = tc.jit(step_in_place, policy="alias")
    step(state, batch(m, 0))
    moved = m.sharding(P(m.model_axis, None))  # w1 split over its rows now
    state["params"]["w1"] = jax.device_put(state["params"]["w1"], moved)
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("jax._src.interpreters.partial_eval")
    logger.addHandler(handler)
    jax.config.update("jax_explain_cache_misses", True)
    try:
        step(state, batch(m, 1))
    finally:
        jax.config.update("jax_explain_cache_misses", False)
        logger.removeHandler(handler)
    w1 = state["params"]["w1"]
    if not _same_sharding(w1.sharding, moved, w1.ndim):
        return f"w1 is placed at {w1.sharding} after the move to {moved}"
    said = (
        f"state['params']['w1']: sharding changed from {P(None, m.model_axis)} to {P(m.model_axis)}"
    )
    if not any(said in text for text in logged):
        return f"the trace again is not explained as {said!r}: {logged}"
    return None


def check_out_shardings_keep_identity(mesh: str, kind: str) -> str | None:
    """out_shardings on a returned input: the caller's own dict and nnx model come back, every
    leaf placed as asked (an untouched one too, written into the caller's container); one array
    returned at two places given two shardings is a ValueError naming both."""
    import treeclone as tc
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    m = Mesh(MESHES[mesh], kind)
    split = m.sharding(P(None, m.model_axis))
    split_rows = m.sharding(P(m.model_axis))
    state = {
        "w": jax.device_put(jnp.ones((8, 16)), split),
        "frozen": jax.device_put(jnp.ones(16), m.repl),
    }

    def bump(st: dict) -> tuple[dict, jax.Array]:
        st["w"] = st["w"] * 2
        return st, st["w"].sum()

    back, _ = tc.jit(
        bump, policy="alias", out_shardings=({"w": m.repl, "frozen": split_rows}, m.repl)
    )(state)
    if back is not state:
        return "the returned dict is not the caller's"
    if not _same_sharding(state["w"].sharding, m.repl, 2):
        return f"state['w'] is placed at {state['w'].sharding}, out_shardings says {m.repl}"
    if not _same_sharding(state["frozen"].sharding, split_rows, 1):
        return f"state['frozen'] is placed at {state['frozen'].sharding}, not {split_rows}"
    model = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
    model.kernel.value = jax.device_put(model.kernel.value, split)
    kernel = model.kernel

    def train(model: Any, x: jax.Array) -> tuple[Any, jax.Array]:
        model.kernel.value = model.kernel.value - 0.1 * x.sum()
        return model, model(x).sum()

    out, _ = tc.jit(train, policy="alias", out_shardings=(m.repl, m.repl))(model, jnp.ones((2, 8)))
    if out is not model or model.kernel is not kernel:
        return "the returned nnx model (or its kernel Variable) is not the caller's"
    if not _same_sharding(kernel.value.sharding, m.repl, 2):
        return f"the kernel is placed at {kernel.value.sharding}, out_shardings says {m.repl}"
    twice = tc.jit(lambda st: (st["w"], st["w"]), policy="alias", out_shardings=(m.repl, split))
    try:
        twice(state)
    except ValueError as exc:
        if "result[0]" not in str(exc) or "result[1]" not in str(exc):
            return f"the error does not name both places: {exc}"
        return None
    return "one array returned at two places with two shardings raised nothing"


def check_rank_change(mesh: str, kind: str) -> str | None:
    """A written-back array whose shape the old sharding no longer fits (a sharded vector
    replaced by its mean, or cut to a length its mesh axis does not divide) is placed as
    jax.jit places the functional step's output, not given the old sharding; one cut to a
    length it still fits keeps it, and an array of its old shape keeps it. Under alias (the
    caller's dict), strict returning the state and jit_partial; values against plain Python
    on NumPy copies."""
    import treeclone as tc
    from jax.sharding import PartitionSpec as P

    m = Mesh(MESHES[mesh], kind)
    split = m.sharding(P(m.model_axis))

    rows = m.sharding(P(m.model_axis, None))  # spelled with a trailing None

    def new() -> dict:
        state = {k: jax.device_put(jnp.arange(16.0) + i, split) for i, k in enumerate("vcuw")}
        state["r"] = jax.device_put(jnp.ones((8, 4)), rows)
        return state

    def shrink(st: dict) -> None:
        st["v"] = st["v"].mean()  # rank 0
        st["c"] = jnp.full(7, st["c"].sum())  # 7 rows: no mesh axis divides them
        st["u"] = st["u"][:8]  # 8 rows: still split evenly
        st["w"] = st["w"] * 2
        st["r"] = st["r"] + 1

    def returning(st: dict) -> dict:
        shrink(st)
        return st

    plain = returning({k: np.asarray(x) for k, x in new().items()})
    reference = jax.jit(lambda st: returning(dict(st)))(new())
    initial = split
    for name in ("alias", "strict", "jit_partial"):
        state = new()
        if name == "alias":
            tc.jit(shrink, policy="alias")(state)
        elif name == "strict":
            state = tc.jit(returning, policy="strict")(state)
        else:
            tc.jit_partial(shrink, state, policy="alias")()
        for k, want in plain.items():
            got = state[k]
            if got.shape != want.shape or not np.allclose(np.asarray(got), want):
                return f"{name}: state[{k!r}] is {np.asarray(got)}, plain Python's {want}"
            ref = reference[k].sharding if k in "vc" else rows if k == "r" else initial
            if not _same_sharding(got.sharding, ref, got.ndim):
                return f"{name}: state[{k!r}] is placed at {got.sharding}, expected {ref}"

    def bump(st: dict) -> None:
        st["r"] = st["r"] + 1
        st["w"] = st["w"] * 2

    # A kept placement is the caller's own, spelled as the caller spelled it (P(model, None);
    # on a mixed mesh JAX spells what its two functions place itself).
    state = {"r": jax.device_put(jnp.ones((8, 4)), rows), "w": new()["w"]}
    tc.jit(bump, policy="alias")(state)
    if state["r"].sharding != rows and not (
        kind == "mixed" and _same_sharding(state["r"].sharding, rows, 2)
    ):
        return f"state['r'] is placed at {state['r'].sharding}, not {rows}"
    return None


# The mesh kinds each case runs on (tests/support/meshes.py): on ``Mesh`` (jax.sharding.Mesh,
# Auto axes), everything on both meshes; on the others, on the 2-D mesh (where ``mixed`` has
# both kinds of axes; on the 1-D one the batch and w1 are split over its one axis, which the
# matrix product cannot do with Explicit axes: jax.jit refuses the step too), for
# ``STEPS_ELSEWHERE`` steps: everything on ``explicit`` (jax.make_mesh's default), the cases
# that place what is written back differently from one another with a mesh current or with
# Explicit and Auto axes, and one step and the rank change on a make_mesh with Auto axes (a
# Mesh with another device order) and on a Mesh made current. CI time grows with each case.
SOME = ("alias", "alias_out_shardings", "strict", "jit_partial_donated", "out_shardings")
ON_KIND: dict[str, tuple[str, ...] | None] = {  # None: every case
    "Mesh": None,
    "explicit": None,
    "explicit+set_mesh": (*SOME, "rank_change"),
    "mixed": (*SOME, "shard_map", "rank_change"),
    "auto": ("alias", "rank_change"),
    "Mesh+set_mesh": ("alias", "rank_change"),
    "Mesh+with": ("alias", "rank_change"),
}
STEPS_ELSEWHERE = 3
CHECKS: dict[str, Callable[[str, str], str | None]] = {
    "out_shardings": check_out_shardings_keep_identity,
    "rank_change": check_rank_change,
    "placement_change": check_placement_change,
    "opt_out": check_opt_out,
    "clone": check_clone,
    "lean_path": check_lean_path,
}
# What the step cannot do on a mesh whose axes are all Explicit, under jax itself too.
NOT_EXPLICIT = {
    "shard_map": "jax.shard_map refuses in_specs (P()) other than an Explicit input's type",
    "placement_change": "w1 split over its rows and its update over its columns cannot be "
    "added with Explicit axes (jax.jit refuses the step too)",
}


def _where(case: str) -> list[tuple[str, str]]:
    """The (mesh, kind) pairs ``case`` (a variant or a check) runs on."""
    return [
        (mesh, kind)
        for kind, cases in ON_KIND.items()
        for mesh in MESHES
        if (kind == "Mesh" or mesh == "2d") and (cases is None or case in cases)
    ]


CASES = [f"{variant}-{mesh}-{kind}" for variant in VARIANTS for mesh, kind in _where(variant)]
CHECK_CASES = [f"{check}-{mesh}-{kind}" for check in CHECKS for mesh, kind in _where(check)]


def run_all() -> dict[str, str | None]:
    results: dict[str, str | None] = {}
    for case in CASES:
        variant, mesh, kind = case.split("-")
        results[case] = _guard(check_variant, mesh, kind, variant)
    for case in CHECK_CASES:
        check, mesh, kind = case.split("-")
        results[case] = _guard(CHECKS[check], mesh, kind)
    return results


def _guard(check: Callable[..., str | None], mesh: str, kind: str, *args: str) -> str | None:
    """``check``'s answer on the mesh of ``kind``, made current as the kind says; a kind the
    installed JAX cannot make: ``SKIP: why``."""
    why = meshes.unavailable(kind)
    if why is None and kind.startswith("explicit"):
        why = NOT_EXPLICIT.get(args[0] if args else check.__name__.removeprefix("check_"))
    if why is not None:
        return f"SKIP: {why}"
    try:
        shape = MESHES[mesh]
        with meshes.current(kind, meshes.make(kind, shape, ("data", "model")[: len(shape)])):
            return check(mesh, kind, *args)
    except Exception as exc:  # noqa: BLE001 - reported per case by the pytest side
        return f"{type(exc).__name__}: {exc}"


# --- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    return run_all_on_cpu_devices(__file__, NUM_DEVICES)


def _checks(check: str) -> list[str]:
    return [case for case in CHECK_CASES if case.startswith(check + "-")]


@pytest.mark.parametrize("case", CASES)
def test_every_leaf_keeps_its_sharding_over_ten_steps_as_jax_jit_with_out_shardings(
    results: dict, case: str
) -> None:
    check_answer(results[case])


@pytest.mark.parametrize("case", _checks("opt_out"))
def test_keep_shardings_false_lets_xla_place_what_is_written_back(results: dict, case: str) -> None:
    check_answer(results[case])


@pytest.mark.parametrize("case", _checks("placement_change"))
def test_a_state_placed_otherwise_between_calls_keeps_its_new_placement(
    results: dict, case: str
) -> None:
    check_answer(results[case])


@pytest.mark.parametrize("case", _checks("out_shardings"))
def test_out_shardings_hand_back_the_callers_objects_placed_as_asked(
    results: dict, case: str
) -> None:
    check_answer(results[case])


@pytest.mark.parametrize("case", _checks("clone"))
def test_clone_places_the_state_as_jax_jit_does(results: dict, case: str) -> None:
    check_answer(results[case])


@pytest.mark.parametrize("case", _checks("lean_path"))
def test_a_state_on_a_mesh_keeps_the_lean_path(results: dict, case: str) -> None:
    check_answer(results[case])


@pytest.mark.parametrize("case", _checks("rank_change"))
def test_a_written_back_array_the_old_sharding_no_longer_fits_is_placed_as_jax_jit_places_it(
    results: dict, case: str
) -> None:
    check_answer(results[case])
