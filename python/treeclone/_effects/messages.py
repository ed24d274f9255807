"""What a trace says: strict's ``MutationError``, clone's report of discarded changes, and the
``ValueError``s of a change no write-back can carry, each naming the user's function and the
key path (``Paths``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax

from treeclone._docs import see
from treeclone._effects.tree import Layout, NodeInfo, Paths, argument_tops
from treeclone._jax_compat import keystr, traced_by
from treeclone.policies import MutationError, MutationWarning, Policy, discarded_mode


def qualname(fun: Any) -> str:
    """How messages name a user's function: its qualified name, else its ``repr``."""
    return getattr(fun, "__qualname__", None) or repr(fun)


def policy_name(policy: Policy) -> str:
    return repr(policy.name) if policy.name is not None else repr(policy)


REMEDY = (
    "Return the mutated object, or use policy='alias' to apply such mutations to the "
    "caller's objects, or policy='clone' to discard them."
)


def mutation_error(
    fun: Callable[..., Any], lines: list[str], remedy: str = REMEDY
) -> MutationError:
    """The strict policy's error: one line per unreturned mutation (``path: what``), then
    ``remedy``, what to do instead (the loops give their own where alias would not apply the
    change as the default text says)."""
    name = qualname(fun)
    return MutationError(
        see(
            "mutation-error",
            f"{name} mutated its inputs in place without returning them (policy 'strict'):\n"
            + "\n".join(f"  {line}" for line in lines)
            + "\n"
            + remedy,
        )
    )


def mutation_lines(bad, pre_def, objs, layout) -> list[str]:
    """``path: what`` for each change of ``bad``, ``(node, changes)`` pairs
    (``describe_changes``)."""
    paths = Paths(pre_def, objs, layout)
    lines = []
    for k, changes in bad:
        for j, what, now in changes:
            where = paths.paths.get(k, "?") if j is None else paths.child(k, j, now)
            lines.append(f"{where or '(the arguments)'}: {what}")
    return lines


def raise_mutation_error(fun, bad, pre_def, objs, layout) -> None:
    raise mutation_error(fun, mutation_lines(bad, pre_def, objs, layout))


def raise_static_mutation(fun, changed: dict[int, list], pre_def, objs, layout) -> None:
    paths = Paths(pre_def, objs, layout).paths
    lines = []
    for k, found in changed.items():
        where = paths.get(k, "?") or "(the arguments)"
        for inner, _, _ in found:
            if inner:
                lines.append(f"{where}{inner}: changed in place, inside the static object {where}")
            else:
                lines.append(f"{where}: static object changed in place")
    raise mutation_error(fun, lines)


def raise_changed_elsewhere(fun, touched, pre_def, objs, layout) -> None:
    paths = Paths(pre_def, objs, layout).paths

    def name(key: int | tuple[int, str]) -> str:
        if isinstance(key, tuple):  # a container held in a registered node's attribute
            return f"{paths.get(key[0], '?') or '(the arguments)'}.{key[1]}"
        return paths.get(key, "?") or "(the arguments)"

    where = ", ".join(name(k) for k in touched)
    raise ValueError(
        see(
            "changed-elsewhere",
            f"{qualname(fun)} changed {where} through another name than its argument (a global, "
            "a closure, an attribute of another object) while that object was also passed in. "
            "The function works on the argument, so the two changes cannot both reach the "
            "caller's object; it was put back as it was. Change it through the argument only.",
        )
    )


def raise_outside_attribute(fun, k, name, pre_def, objs, layout) -> None:
    where = Paths(pre_def, objs, layout).paths.get(k, "?") or "(the arguments)"
    raise ValueError(
        see(
            "attribute-not-carried",
            f"{qualname(fun)} set the attribute {name!r} on {where} ({type(objs[k]).__name__}), "
            "which its pytree flatten does not carry, so the call cannot hand it back to the "
            "caller's object. Make it part of the node's flatten, or set it outside the "
            "transformed function.",
        )
    )


def raise_traced_static_data(fun, k, pre_def, objs, layout) -> None:
    where = Paths(pre_def, objs, layout).paths.get(k, "?") or "(the arguments)"
    name = qualname(fun)
    raise ValueError(
        see(
            "traced-static-data",
            f"{name} stored a traced value in the static data of {where} "
            f"({type(objs[k]).__name__}: a field its pytree flatten keeps as aux data, not as a "
            "leaf). Static data must be concrete: make that field a leaf, or compute it outside "
            "the transformed function.",
        )
    )


def per_argument_remedy(
    lost: Sequence[int], info: list, layout: Layout, arg_policies: Sequence[Policy]
) -> str:
    """The fix for changes a call mixing policies discards (``lost``: input nodes changed in
    arguments left alone): the per-argument dict that writes them back, naming the arguments
    (``policy={"state": "alias", "batch": "alias"}``), as the call's arguments stand."""
    tops = argument_tops(info, layout)
    changed = set()
    for a, (top, _) in enumerate(tops):
        size = info[top].size if isinstance(info[top], NodeInfo) else 1
        if any(top - size < k <= top for k in lost):
            changed.add(a)
    items = []
    for a, ((_, key), chosen) in enumerate(zip(tops, arg_policies, strict=False)):
        shown = "'alias'" if a in changed else policy_name(chosen)
        items.append(f"{key!r}: {shown}")
    names = ", ".join(repr(tops[a][1]) for a in sorted(changed))
    return (
        "Return the changed objects, or give the argument its own policy to apply such "
        f"changes to the caller's objects: 'alias' for {names}, as in "
        "policy={" + ", ".join(items) + "}."
    )


def report_off(mode: str | None) -> bool:
    """Whether discarded changes go unreported, as the block, ``mode`` or the global say."""
    return discarded_mode(mode) == "off"


def report_discarded(
    fun: Callable[..., Any],
    lines: list[str],
    mode: str | None,
    policy: str = "'clone' (what jax.jit does)",
    remedy: str | None = None,
) -> None:
    """Warn about (or raise for) the changes ``lines`` (``path: what``) that ``fun`` made in
    place and that ``clone`` discards, as the block's, the function's (``mode``) or the
    global setting says."""
    chosen = discarded_mode(mode)
    if chosen == "off" or not lines:
        return
    name = qualname(fun)
    text = (
        f"{name} changed its inputs in place without returning them; under policy {policy} "
        "these changes are discarded and the caller's objects keep their old values:\n"
        + "\n".join(f"  {line}" for line in lines)
        + "\n"
        + (
            remedy
            or "Return the changed objects, or use policy='alias' to apply such changes to the "
            "caller's objects."
        )
        + " (treeclone.set_discarded_mutations, or discarded_mutations= on treeclone.jit, says "
        "'off' or 'error' instead of this warning.)"
    )
    text = see("mutation-warning", text)
    if chosen == "error":
        raise MutationError(text)
    code = getattr(inspect.unwrap(fun), "__code__", None)
    if code is None:
        warnings.warn(text, MutationWarning, stacklevel=3)
    else:  # at the user's function: the trace that finds it runs deep inside jax
        warnings.warn_explicit(
            text,
            MutationWarning,
            code.co_filename,
            code.co_firstlineno,
            module=getattr(fun, "__module__", None),
        )


# Each JAX transformation, as users call it, with treeclone's that keeps in-place changes
# inside an alias step, and the names JAX gives its traces (what its tracers were
# ``traced_for``).
_TRANSFORMATIONS = (
    ("jax.jit", "treeclone.jit", ("jit",)),
    ("jax.grad (or value_and_grad, vjp)", "treeclone.grad/value_and_grad", ("grad",)),
    ("jax.vmap", "treeclone.vmap", ("vmap",)),
    ("jax.lax.scan", "treeclone.scan", ("scan",)),
    ("jax.lax.fori_loop", "treeclone.fori_loop", ("fori_loop",)),
    ("jax.lax.while_loop", "treeclone.while_loop", ("while_body", "while_cond")),
    ("jax.lax.cond", "treeclone.cond", ("cond",)),
    ("jax.lax.switch", "treeclone.switch", ("switch",)),
    ("jax.checkpoint", "treeclone.checkpoint", ("remat", "checkpoint", "checkpoint / remat")),
    ("jax.shard_map", "treeclone.shard_map", ("shard_map",)),
)
_INSTEAD = {name: (jax_name, ours) for jax_name, ours, names in _TRANSFORMATIONS for name in names}

# checkify closes over its function's arguments and keeps only its result: no treeclone
# transformation replaces it, the way that works is checkify inside the step.
CHECKIFY_REMEDY = (
    "checkify runs its function on the very objects it is given and keeps only what it "
    "returns, so it cannot carry an alias step's in-place changes, inside or around it. Call "
    "checkify.checkify inside the alias step, on a part that returns what it changes, assign "
    "that to the containers, and return checkify's Error from the step; call err.throw() on "
    'the result (docs/semantics.md, "checkify").'
)


def jax_transformation(tracer: Any) -> tuple[str | None, str | None]:
    """How users call the JAX transformation ``tracer`` belongs to (None: unknown), and
    treeclone's transformation to use instead inside an alias step (None: none, checkify)."""
    name = traced_by(tracer)
    if name == "checkify":
        return "jax.experimental.checkify.checkify", None
    return _INSTEAD.get(name or "", (None, "treeclone's transformation of the same name"))


def instead(tracer: Any, tail: str) -> str:
    """What to do instead of running an alias step's in-place change inside ``tracer``'s
    transformation: treeclone's transformation there, with ``policy='alias'``; ``tail`` goes
    on from there."""
    jax_name, ours = jax_transformation(tracer)
    if ours is None:
        return CHECKIFY_REMEDY
    if jax_name is None:
        return (
            "Use treeclone's transformation of the same name there (treeclone.jit, grad, vmap, "
            f"scan, cond, checkpoint, ...) with policy='alias'{tail}"
        )
    return f"Use {ours}(..., policy='alias') there instead of {jax_name}{tail}"


def enclosing_write_error(name: str, tracer: Any, path: str) -> ValueError:
    """Rule J31's error: an alias call inside the JAX transformation of ``tracer`` (one of its
    results) would write it into ``path``, an object from outside that transformation."""
    jax_name, _ = jax_transformation(tracer)
    return ValueError(
        see(
            "jax-transformation-inside",
            f"{name} (policy alias) was called inside a JAX transformation "
            f"({jax_name or 'jax.grad, jax.vmap, jax.jit, jax.lax.scan, ...'}) and would write a "
            f"traced value of it into {path}, whose argument holds none of that transformation's "
            "values: an object from outside it would keep a tracer once it returns, and a copy it "
            "made of its argument is dropped, so the caller would not get the value either way "
            "(a container made inside it from constants alone cannot be told from one from "
            "outside: make it from a traced value, or empty). Nothing was written. "
            + instead(
                tracer,
                ", and pass that object to it as an argument (a loop's carry): it writes concrete "
                "values back into the caller's objects. Or return the value.",
            ),
        )
    )


def leaf_path(root: tuple, layout: Layout, leaf: Any) -> str | None:
    """The key path of ``leaf`` in the arguments ``root`` (``(*args, kwargs)``; messages only)."""
    args, kwargs = layout.split(root)
    named = [(layout.arg_name(i), a) for i, a in enumerate(args)]
    named += [(str(k), v) for k, v in kwargs.items()]
    for name, value in named:
        for path, x in jax.tree_util.tree_flatten_with_path(value)[0]:
            if x is leaf:
                return name + keystr(path)
    return None


def raise_escaped(fun: Any, tracer: Any, where: str, policy: Policy) -> NoReturn:
    """The error for a traced value of a JAX transformation that has returned, found in the
    function's arguments at ``where`` after the call (a change made in place inside it)."""
    jax_name = jax_transformation(tracer)[0] or "a JAX transformation"
    raise ValueError(
        see(
            "jax-transformation-inside",
            f"{qualname(fun)} (policy {policy_name(policy)}) changed {where} in place inside "
            f"{jax_name}, which has returned: that change holds a traced value of it that no "
            f"longer exists (JAX's UnexpectedTracerError), because {jax_name} keeps only what "
            "its function returns. "
            + instead(
                tracer,
                ", and pass that container to it as an argument (a loop's carry), not through a "
                "closure: it writes what its function changes in place back into it, as plain "
                f"Python does. Or return the value from the function {jax_name} runs.",
            ),
        )
    )


def traced_remedy(exc: TypeError, path: str, leaf: Any) -> TypeError:
    """jax.jit's TypeError ``exc`` for the leaf at ``path`` that is not a JAX type, with the
    remedy: ``traced="arrays"`` (equinox's rule) or a static argument."""
    new = TypeError(
        see(
            "not-a-jax-type",
            f"{exc}\n{path} is a {type(leaf).__name__}, not an array. To keep such leaves out "
            "of the computation (an equinox Module's activation function, a string field), "
            "give treeclone.jit traced='arrays': the arrays are traced and every other leaf is "
            'static, as under eqx.filter_jit (docs/semantics.md, "Leaves that are not arrays"); '
            "or make the whole argument static (static_argnums/static_argnames).",
        )
    )
    return new.with_traceback(exc.__traceback__)
