"""The import graph of ``python/treeclone``: no circle, and no private names across modules.

Read from the source with ``ast`` (nothing is imported): every ``import treeclone...`` and
``from treeclone... import ...``, at the top of a module or inside a function, is an edge from
the module to the one it imports. The modules must form no cycle, so each can be read (and
imported) after the ones below it: what a call did (``_effects``) below the call machinery the
transformations share (``_lift``), that below ``_jit`` and the lifted transformations,
``policies`` below them all.

A name with a leading underscore is private to the module that defines it: no module imports
one from another treeclone module (``from treeclone._jit.jitted import _FunSignature``),
reaches for one through a module it imported (``_effects.enclosing._Structure``) or reads one
of another module's classes on an object (``jitted._fun``). What modules share has a public
name in the module that owns it; a private *module* (``_native``, ``_effects``, ``_lift``) is
imported as any other, its public names being its API inside the package.

Each transformation stands on the shared lift (``_lift``, and ``_effects``: what a call did)
and holds its own machinery, in its package (``_jit``, ``vmap``, ``loops``, ...) or module:
no transformation imports another's machinery (its API at most), nothing reaches past a
package's API into its modules, and every module of the shared lift is used by two
transformations or more (one transformation's alone belongs in its package).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "treeclone"

# (importing module, "module.name") -> why it cannot be avoided. Empty: keep it so.
ALLOWED_PRIVATE: Mapping[tuple[str, str], str] = {}


# The subpackage that is one node of the graph: the benchmark harness, above the library.
WHOLE = {"bench"}


def module_names(package: Path, prefix: str = "treeclone") -> set[str]:
    """The package's modules, as imported: ``treeclone``, ``treeclone.jit``, the native
    ``treeclone._native`` (a compiled module, with its ``.pyi``), a subpackage's modules
    (``treeclone._effects``, ``treeclone._effects.steps``), the ``bench`` subpackage as one."""
    names = {prefix}
    for path in package.iterdir():
        stem = path.name.split(".")[0]
        if path.suffix in (".py", ".pyi", ".so", ".pyd") and stem != "__init__":
            names.add(f"{prefix}.{stem}")
        elif path.is_dir() and (path / "__init__.py").exists():
            if path.name in WHOLE:
                names.add(f"{prefix}.{path.name}")
            else:
                names |= module_names(path, f"{prefix}.{path.name}")
    return names


def source_files(package: Path, prefix: str = "treeclone") -> dict[str, Path]:
    """Each Python module of the package (``bench`` aside) and its file."""
    found = {}
    for path in sorted(package.iterdir()):
        if path.suffix == ".py":
            found[prefix if path.stem == "__init__" else f"{prefix}.{path.stem}"] = path
        elif path.is_dir() and (path / "__init__.py").exists() and path.name not in WHOLE:
            found |= source_files(path, f"{prefix}.{path.name}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` as a string, for a chain of attributes on a name (else None)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def scan(source: str, name: str, modules: set[str]) -> tuple[set[str], list[str]]:
    """What the module ``name`` (its ``source``) imports from the package (module names), and
    each private name it takes from another module, as ``"line N: module._name"``."""
    tree = ast.parse(source)
    package = name if name == "treeclone" else name.rsplit(".", 1)[0]
    imported: set[str] = set()
    private: list[str] = []
    bound: dict[str, str] = {}  # a local name -> the treeclone module it is bound to

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "treeclone":
                    continue
                imported.add(alias.name)
                if alias.asname is not None:
                    bound[alias.asname] = alias.name
                else:
                    bound["treeclone"] = "treeclone"
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package the module is in
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source_module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source_module = node.module or ""
            if source_module.split(".")[0] != "treeclone":
                continue
            for alias in node.names:
                submodule = f"{source_module}.{alias.name}"
                if submodule in modules:  # ``from treeclone import _native``: a module
                    imported.add(submodule)
                    bound[alias.asname or alias.name] = submodule
                    continue
                imported.add(source_module)
                if _private(alias.name) and source_module != name:
                    private.append(f"line {node.lineno}: {source_module}.{alias.name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            dotted = _dotted(node.value)
            if dotted is None:
                continue
            head, *rest = dotted.split(".")
            if head not in bound:
                continue
            module = ".".join([bound[head], *rest])
            if module in modules and module != name:
                private.append(f"line {node.lineno}: {module}.{node.attr}")
    imported.discard(name)
    return imported, sorted(private, key=lambda where: int(where.split()[1].rstrip(":")))


def read_package(package: Path) -> dict[str, tuple[set[str], list[str]]]:
    """For each Python module of the package (``bench`` aside): what it imports from the
    package and the private names it takes from other modules."""
    modules = module_names(package)
    return {
        name: scan(path.read_text(encoding="utf-8"), name, modules)
        for name, path in source_files(package).items()
    }


def cycles(graph: Mapping[str, set[str]]) -> Iterator[list[str]]:
    """A cycle through each strongly connected component of more than one module (Tarjan's
    algorithm, then a path around the component), as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    for component in components:
        if len(component) < 2:
            continue
        members, start = set(component), min(component)
        path, seen = [start], {start}
        while True:  # inside a strongly connected component every step can stay inside it
            nxt = sorted(w for w in graph[path[-1]] if w in members)
            back = [w for w in nxt if w == start]
            if back and len(path) > 1:
                yield [*path, start]
                break
            fresh = [w for w in nxt if w not in seen]
            if not fresh:  # closes on a module met before: report that loop
                w = nxt[0]
                yield [*path[path.index(w) :], w]
                break
            path.append(fresh[0])
            seen.add(fresh[0])


FOUND = read_package(PACKAGE)
GRAPH = {name: imported for name, (imported, _) in FOUND.items()}


def test_the_package_is_read() -> None:
    """The scan sees the package: its modules and the imports everyone knows are there."""
    jitted = "treeclone._jit.jitted"
    assert {"treeclone", jitted, "treeclone.policies", "treeclone._jit.partial"} <= set(GRAPH)
    assert "treeclone.policies" in GRAPH[jitted]
    assert "treeclone._native" in GRAPH[jitted]  # ``from treeclone import _native``
    assert "treeclone._jit" in GRAPH["treeclone"]


def test_the_import_graph_has_no_cycle() -> None:
    found = [" -> ".join(cycle) for cycle in cycles(GRAPH)]
    assert not found, "modules of python/treeclone import each other:\n" + "\n".join(found)


# The layers, lowest first: a module imports modules of its own layer and of those below only.
# The trace (running a function and working out what it did) knows no lift; the lift (the call
# every transformation makes: arguments, statics, naming, the runner) knows no transformation.
LAYERS: list[tuple[str, set[str]]] = [
    (
        "core",
        {
            "treeclone._native",
            "treeclone._docs",
            "treeclone._jax_compat",
            "treeclone._known_flatten",
            "treeclone._writeback",
            "treeclone.policies",
            "treeclone._policy_keys",
            "treeclone.tree_util",
            "treeclone.tree",
            "treeclone.jaxlib_tree_util",
        },
    ),
    ("effects", {"treeclone._effects", "treeclone._effects.*", "treeclone._retrace"}),
    ("lift", {"treeclone._lift", "treeclone._lift.*"}),
    (
        "transformations",
        {
            "treeclone.call",
            "treeclone._jit",
            "treeclone._jit.*",
            "treeclone.grad",
            "treeclone.grad.*",
            "treeclone.checkpoint",
            "treeclone.vmap",
            "treeclone.vmap.*",
            "treeclone.shard_map",
            "treeclone.loops",
            "treeclone.loops.*",
            "treeclone.cond",
            "treeclone.cond.*",
        },
    ),
    ("package", {"treeclone", "treeclone.bench"}),
]

TRANSFORMATIONS_LAYER = [name for name, _ in LAYERS].index("transformations")

# Edges between two transformations -> why. Each transformation stands on the lift alone.
TRANSFORMATION_EDGES: Mapping[tuple[str, str], str] = {
    ("treeclone.cond", "treeclone.call"): "cond with a concrete predicate outside jit is a call",
}


def transformation_of(module: str) -> str:
    """The transformation a module of the transformations' layer belongs to: a package's
    modules (``treeclone._jit.stages``) are its own (``treeclone._jit``), one transformation."""
    parts = module.split(".")
    return ".".join(parts[:2])


def layer_of(module: str) -> int:
    for i, (_, members) in enumerate(LAYERS):
        if module in members or any(
            m.endswith(".*") and module.startswith(m[:-1]) for m in members
        ):
            return i
    raise AssertionError(f"{module} is in no layer of LAYERS: give it one")


def test_every_module_has_a_layer() -> None:
    for module in module_names(PACKAGE):
        layer_of(module)


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    found = [
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, imported in sorted(GRAPH.items())
        for b in sorted(imported)
        if layer_of(b) > layer_of(a)
    ]
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_no_transformation_imports_another() -> None:
    found = {
        (transformation_of(a), transformation_of(b))
        for a, imported in GRAPH.items()
        for b in imported
        if layer_of(a) == layer_of(b) == TRANSFORMATIONS_LAYER
        and transformation_of(a) != transformation_of(b)
    }
    assert found == set(TRANSFORMATION_EDGES), found ^ set(TRANSFORMATION_EDGES)


# Imports that reach past a package's API (a module inside another package) -> why. Empty:
# each transformation's machinery is in its own package (issue 58), keep it so.
PAST_THE_API: Mapping[tuple[str, str], str] = {}


def test_nothing_reaches_past_a_package_s_api() -> None:
    """A subpackage's modules (``treeclone._lift.arguments``) are imported by that subpackage
    alone: every other module imports the subpackage itself, its API (``treeclone._lift``)."""
    found = {
        (a, b)
        for a, imported in GRAPH.items()
        for b in imported
        if b.count(".") >= 2 and not (a + ".").startswith(b.rsplit(".", 1)[0] + ".")
    }
    assert found == set(PAST_THE_API), found ^ set(PAST_THE_API)


def test_a_transformation_imports_only_another_s_api() -> None:
    """A transformation's package imports no other transformation's machinery: another
    transformation is imported through its API alone (``treeclone.call``, ``treeclone.cond``,
    never ``treeclone.cond.join``); its private names are its own (the tests above)."""
    found = sorted(
        f"{a} imports {b}"
        for a, imported in GRAPH.items()
        for b in imported
        if layer_of(a) == layer_of(b) == TRANSFORMATIONS_LAYER
        and transformation_of(a) != transformation_of(b)
        and b != transformation_of(b)
    )
    assert not found, "a transformation imports another's machinery:\n" + "\n".join(found)


# --- the shared lift: what two transformations use ----------------------------------------------

# The transformations, as the rule below counts them: each package or module of the
# transformations' layer. jit and jit_partial are one (their package ``_jit``: jit_partial is a
# jit with bound arguments, on jit's machinery); ``call`` (a call under a policy, without jit)
# is one, and so is each of grad (with value_and_grad), vmap, the loops (scan, fori_loop and
# while_loop, on one machinery), cond (with switch), shard_map and checkpoint (with remat).
TRANSFORMATIONS = {
    "treeclone._jit",
    "treeclone.call",
    "treeclone.grad",
    "treeclone.vmap",
    "treeclone.loops",
    "treeclone.cond",
    "treeclone.shard_map",
    "treeclone.checkpoint",
}

# The shared lift: the lift (the call every transformation makes) and the trace it runs (also
# what ``call`` runs eagerly). What one transformation alone uses lives in its own package.
SHARED = ("treeclone._lift", "treeclone._effects")

# A module of the shared lift used by fewer than two transformations -> why. Empty: keep it so.
SHARED_BY_ONE: Mapping[str, str] = {}


def exported(init: Path, api: str) -> dict[str, str]:
    """A package's API (its ``__init__.py``): each name it exports -> the module of the package
    that defines it (``Naming`` -> ``treeclone._lift.naming``)."""
    return {
        alias.asname or alias.name: node.module
        for node in ast.parse(init.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(api + ".")
        for alias in node.names
    }


def used_modules(source: str, modules: set[str], apis: Mapping[str, Mapping[str, str]]) -> set[str]:
    """The package's modules whose code a module (its ``source``) uses: each it imports, a name
    taken from a package's API (``from treeclone._lift import Naming``, ``_lift.begin``) being a
    use of the module that defines it (``apis``: each API's names, as :func:`exported` reads)."""
    tree = ast.parse(source)
    used: set[str] = set()
    bound: dict[str, str] = {}  # a local name -> the treeclone module it is bound to

    def take(module: str, name: str) -> None:
        used.add(apis[module].get(name, module) if module in apis else module)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname is not None:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module in modules:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:  # ``from treeclone import _lift``: a module
                    bound[alias.asname or alias.name] = submodule
                else:
                    take(node.module, alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in bound:
                take(bound[node.value.id], node.attr)
    return used


def _shared(module: str) -> bool:
    return any(module.startswith(package + ".") for package in SHARED)


def users_of_the_shared_lift(package: Path) -> dict[str, set[str]]:
    """Each module of the shared lift (its packages' APIs aside) -> the transformations that use
    it: through a name they take from it, or through a module of the shared lift they use that
    uses it (the lift's ``runner`` stands on its ``boxes``: who uses the runner uses both)."""
    modules = module_names(package)
    apis = {
        api: exported(package.joinpath(*api.split(".")[1:], "__init__.py"), api) for api in SHARED
    }
    used = {
        name: used_modules(path.read_text(encoding="utf-8"), modules, apis)
        for name, path in source_files(package).items()
    }
    transformations = {m for m in used if layer_of(m) == TRANSFORMATIONS_LAYER}
    return users_of({m for m in used if _shared(m)}, transformations, used)


def users_of(
    shared: set[str], transformations: set[str], used: Mapping[str, set[str]]
) -> dict[str, set[str]]:
    """Each ``shared`` module -> the transformations (:func:`transformation_of` each module of
    ``transformations``) that reach it in ``used`` (a module -> the modules it uses) through
    shared modules alone."""
    users: dict[str, set[str]] = {m: set() for m in shared}
    for module in transformations:
        reached: set[str] = set()
        stack = [m for m in used[module] if m in shared]
        while stack:
            m = stack.pop()
            if m not in reached:
                reached.add(m)
                stack.extend(u for u in used.get(m, ()) if u in shared)
        for m in reached:
            users[m].add(transformation_of(module))
    return users


USERS = users_of_the_shared_lift(PACKAGE)


def test_the_transformations_are_those_of_their_layer() -> None:
    layer = {transformation_of(m) for m in GRAPH if layer_of(m) == TRANSFORMATIONS_LAYER}
    assert layer == TRANSFORMATIONS


def test_every_module_of_the_shared_lift_is_used_by_two_transformations() -> None:
    """A module of ``_lift`` or ``_effects`` used by one transformation alone is that
    transformation's machinery: it belongs in the transformation's package (issue 58)."""
    found = [
        f"{module}: used by {', '.join(sorted(users)) or 'no transformation'}"
        for module, users in sorted(USERS.items())
        if len(users) < 2 and module not in SHARED_BY_ONE
    ]
    assert not found, (
        "modules of the shared lift that one transformation alone uses:\n" + "\n".join(found)
    )
    assert set(SHARED_BY_ONE) <= {m for m, users in USERS.items() if len(users) < 2}


def test_no_module_takes_a_private_name_from_another() -> None:
    found = [
        f"{name} {where}"
        for name, (_, private) in sorted(FOUND.items())
        for where in private
        if (name, where.split(": ", 1)[1]) not in ALLOWED_PRIVATE
    ]
    assert not found, (
        "private names used across modules (give what is shared a public name in the module "
        "that owns it):\n" + "\n".join(found)
    )


def test_every_allowed_exception_is_still_needed() -> None:
    used = {
        (name, where.split(": ", 1)[1]) for name, (_, private) in FOUND.items() for where in private
    }
    assert set(ALLOWED_PRIVATE) <= used, set(ALLOWED_PRIVATE) - used


# --- private attributes -------------------------------------------------------------------------

# A class's private attributes (``_fun``, ``_refuse``: a leading underscore, not a dunder)
# belong to the module that defines the class. Another module reads none of them, on any
# object (``jitted._fun``, ``self._bound._flatten()``): what modules share goes through a public
# name or an interface object (``Jitted.interface()``). ``self._x`` and ``cls._x`` are a class's
# own; a name no class of the package defines (``jax._src``, a namedtuple's ``_fields``) is not
# the package's to police.

# (reading module, attribute) -> why it cannot be avoided. Empty: keep it so.
ALLOWED_PRIVATE_ATTRIBUTES: Mapping[tuple[str, str], str] = {}


def class_private_names(tree: ast.Module) -> set[str]:
    """The private attributes the classes of a module define: their methods, class-level
    names, ``__slots__`` entries and the attributes their methods set on ``self``/``cls``."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    names.add(target.id)
                    if target.id == "__slots__" and node.value is not None:
                        names |= {
                            c.value
                            for c in ast.walk(node.value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        }
    return {name for name in names if _private(name)}


def foreign_attributes(tree: ast.Module, own: set[str], package: set[str]) -> list[str]:
    """Each read of a private attribute that a class of the package defines (``package``) but
    no class of this module does (``own``), on an object other than ``self``/``cls``, as
    ``"line N: x._name"``."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if node.attr in package and node.attr not in own:
            found.append((node.lineno, f"line {node.lineno}: {ast.unparse(node)}"))
    return [where for _, where in sorted(found)]


def read_attributes(package: Path) -> dict[str, list[str]]:
    """For each Python module of the package: the private attributes of other modules' classes
    it reads. The native module's classes are read from its stub (``_native.pyi``)."""
    trees = {
        name: ast.parse(path.read_text(encoding="utf-8"))
        for name, path in source_files(package).items()
    }
    owned = {name: class_private_names(tree) for name, tree in trees.items()}
    stub = package / "_native.pyi"
    everyone = set().union(
        class_private_names(ast.parse(stub.read_text(encoding="utf-8"))), *owned.values()
    )
    return {name: foreign_attributes(tree, owned[name], everyone) for name, tree in trees.items()}


ATTRIBUTES = read_attributes(PACKAGE)


def _attribute(where: str) -> str:
    return "_" + where.rsplit("._", 1)[1]


def test_no_module_reads_another_modules_private_attributes() -> None:
    found = [
        f"{name} {where}"
        for name, reads in sorted(ATTRIBUTES.items())
        for where in reads
        if (name, _attribute(where)) not in ALLOWED_PRIVATE_ATTRIBUTES
    ]
    assert not found, (
        "private attributes of another module's class read (give what is shared a public "
        "name, or an interface object, in the module that owns it):\n" + "\n".join(found)
    )


def test_every_allowed_attribute_is_still_needed() -> None:
    used = {(name, _attribute(where)) for name, reads in ATTRIBUTES.items() for where in reads}
    assert set(ALLOWED_PRIVATE_ATTRIBUTES) <= used, set(ALLOWED_PRIVATE_ATTRIBUTES) - used


_OWNER = """
class Jitted:
    __slots__ = ("_slot",)
    _level = 1
    def __init__(self):
        self._fun = None
    def _call(self):
        return self._fun
"""


def test_the_private_names_of_a_module_s_classes_are_read() -> None:
    assert class_private_names(ast.parse(_OWNER)) == {"_slot", "_level", "_fun", "_call"}


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("jitted._fun", ["line 1: jitted._fun"]),
        ("self._bound._call()", ["line 1: self._bound._call"]),
        ("f(x)._level", ["line 1: f(x)._level"]),
        ("self._fun\ncls._call()", []),  # a class's own
        ("x._own", []),  # defined in this module
        ("x.__dict__\nx._fields\njax._src", []),  # a dunder; names no class of ours defines
    ],
)
def test_the_attribute_scan(source: str, found: list[str]) -> None:
    package = class_private_names(ast.parse(_OWNER)) | {"_own"}
    assert foreign_attributes(ast.parse(source), {"_own"}, package) == found


# --- the checker itself -------------------------------------------------------------------------

MODULES = {"treeclone", "treeclone.jit", "treeclone._native", "treeclone._effects", "treeclone.a"}


@pytest.mark.parametrize(
    ("source", "imported", "private"),
    [
        ("from treeclone.jit import _Naming", {"treeclone.jit"}, ["treeclone.jit._Naming"]),
        ("from treeclone.jit import Jitted as _J", {"treeclone.jit"}, []),
        (
            "from treeclone import _native, _effects",
            {"treeclone._native", "treeclone._effects"},
            [],
        ),
        ("from treeclone import jit\njit._take([])", {"treeclone.jit"}, ["treeclone.jit._take"]),
        (
            "import treeclone._effects as t\nt._Paths",
            {"treeclone._effects"},
            ["treeclone._effects._Paths"],
        ),
        (
            "import treeclone.jit\ntreeclone.jit._Naming",
            {"treeclone.jit"},
            ["treeclone.jit._Naming"],
        ),
        (
            "def f():\n    from treeclone.jit import _keystr",
            {"treeclone.jit"},
            ["treeclone.jit._keystr"],
        ),
        ("from . import jit\nfrom .jit import _x", {"treeclone.jit"}, ["treeclone.jit._x"]),
        ("from treeclone.a import _own", set(), []),  # its own name
        ("from treeclone.jit import __all__", {"treeclone.jit"}, []),
        ("import jax\njax._src", set(), []),
    ],
)
def test_the_scan(source: str, imported: set[str], private: list[str]) -> None:
    found_imported, found_private = scan(source, "treeclone.a", MODULES)
    assert found_imported == imported
    assert [p.split(": ", 1)[1] for p in found_private] == private


APIS = {"treeclone._lift": {"Naming": "treeclone._lift.naming", "begin": "treeclone._lift.runner"}}
LIFT = {"treeclone", "treeclone._lift", "treeclone._lift.naming", "treeclone._lift.runner"}


@pytest.mark.parametrize(
    ("source", "used"),
    [
        ("from treeclone._lift import Naming", {"treeclone._lift.naming"}),
        ("from treeclone import _lift\n_lift.begin()", {"treeclone._lift.runner"}),
        ("import treeclone._lift as lift\nlift.Naming", {"treeclone._lift.naming"}),
        ("from treeclone._lift.runner import x", {"treeclone._lift.runner"}),
        ("from treeclone._lift import unknown", {"treeclone._lift"}),
    ],
)
def test_the_use_scan(source: str, used: set[str]) -> None:
    assert used_modules(source, LIFT, APIS) == used


def test_a_module_one_transformation_uses_is_found() -> None:
    used = {
        "treeclone.a": {"treeclone._lift.x"},
        "treeclone.b.face": {"treeclone._lift.x", "treeclone._lift.y"},
        "treeclone._lift.x": {"treeclone._lift.z"},
        "treeclone._lift.y": set(),
        "treeclone._lift.z": set(),
    }
    shared = {"treeclone._lift.x", "treeclone._lift.y", "treeclone._lift.z"}
    users = users_of(shared, {"treeclone.a", "treeclone.b.face"}, used)
    assert users == {
        "treeclone._lift.x": {"treeclone.a", "treeclone.b"},
        "treeclone._lift.y": {"treeclone.b"},
        "treeclone._lift.z": {"treeclone.a", "treeclone.b"},
    }


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert list(cycles(graph)) == [["a", "b", "c", "a"]]
    assert list(cycles({"a": {"b"}, "b": set()})) == []
