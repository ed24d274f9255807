"""The Layout section (README's until the documentation site, now the site's Development page,
``docs/site/development.md``) names every module of the Python package, so that a reader who
starts there finds the code: a top-level module by its file name (`` `call.py` ``), a module of a
subpackage by its file name in the bullet that names the subpackage (`` `_effects/` ``). The
benchmark harness (``bench/``) is named as a whole."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "treeclone"
LAYOUT_PAGE = ROOT / "docs" / "site" / "development.md"


def layout_bullets(readme: str) -> list[str]:
    """The Layout section's bullets (nested ones apart), each with its continuation lines."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    bullets: list[str] = []
    for line in section.splitlines():
        if re.match(r"\s*- ", line):
            bullets.append(line)
        elif bullets and line.strip():
            bullets[-1] += " " + line.strip()
    return bullets


def modules() -> list[tuple[str | None, str]]:
    """``(subpackage or None, file name)`` of every Python module (``bench/`` aside, and
    package ``__init__`` files, which hold no code of their own but the API)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "bench" or path.name == "__init__.py":
            continue
        found.append((rel.parts[0] if len(rel.parts) > 1 else None, path.name))
    return found


def test_the_layout_names_every_module() -> None:
    bullets = layout_bullets(LAYOUT_PAGE.read_text(encoding="utf-8"))
    missing = []
    for package, name in modules():
        if package is None:
            ok = any(f"`{name}`" in b for b in bullets)
        else:
            ok = any(f"`{package}/`" in b and f"`{name}`" in b for b in bullets)
        if not ok:
            missing.append(name if package is None else f"{package}/{name}")
    assert not missing, "The Layout (docs/site/development.md) does not name: " + ", ".join(missing)


def test_the_layout_names_no_module_that_is_gone() -> None:
    bullets = layout_bullets(LAYOUT_PAGE.read_text(encoding="utf-8"))
    package_bullets = [b for b in bullets if "`python/treeclone/`" in b or "`_" in b]
    present = {name for _, name in modules()} | {"__init__.py"}
    named = {m for b in package_bullets for m in re.findall(r"`(\w+\.py)`", b)}
    gone = ", ".join(sorted(named - present))
    assert named <= present, (
        f"The Layout (docs/site/development.md) names modules that are gone: {gone}"
    )


def test_the_checker_finds_a_missing_module() -> None:
    bullets = layout_bullets("x\n## Layout\n\n- `a.py`\n  - `_t/`: `b.py`,\n    `c.py`\n## End\n")
    assert bullets == ["- `a.py`", "  - `_t/`: `b.py`, `c.py`"]
