"""docs/semantics.md names, for every rule, a test that checks it, and where that test lives.

A test is named in backticks, either with its file (``tests/policies/test_cycles.py::test_x``)
or alone (``test_x``); a scenario of ``tests/transforms/test_shard_map.py`` by its name without
the ``sc_`` prefix. A name alone must be defined in a file that its rule (or paragraph) names,
or else in the files its section names outside its rules ("Tests: `tests/...`"; the nearest
section that names any, the document's own opening for the rest:
``tests/policies/test_policies.py``). A file is named by its path or, when that is unique in
``tests/``, by its base name (``test_loops_nnx.py``).

Rules are the numbered paragraphs, numbered one way: the letter of their section and their
place in it, from 1 (``J12.``: jit's policies, ``P``: a policy per argument, ``G``: grad and
checkpoint, ``V``: vmap, ``S``: shard_map, ``L``: the loops, ``C``: cond). A reference to a rule
anywhere in the sources or the docs (``rule J31``, ``rules J5-J30``, ``rules J30 and L16``)
names one that exists.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "semantics.md"

RULE_START = re.compile(r"^([A-Z]\d+)\. \*\*")
SECTION_LETTERS = "JPGVSLC"
# "rule J31", "rules J5-J30", "rules J30 and L16", "Rule P5's": the word, then a list of rules;
# a line break inside a comment may come between them.
_ID = r"(?:[A-Z]\d+|\d+[a-z]?)"
_SEP = r"(?:\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+|\s*[-\u2013]\s*)"
RULE_REFERENCE = re.compile(
    r"\b[Rr]ules?\s+(?:(?:#|//[/!]?)\s*)?(" + _ID + "(?:" + _SEP + _ID + r")*)\b"
)
HEADING = re.compile(r"^(#+) ")
CODE = re.compile(r"`([^`]+)`")
FILE = re.compile(r"(?:tests/[\w/]+/)?test_\w+\.py|tests/support/\w+\.py")
QUALIFIED = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
TEST_NAME = re.compile(r"test_\w+")
SCENARIO_NAME = re.compile(r"[a-z]\w+")


def definitions(tests: pathlib.Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``{test or scenario function name: files}`` and ``{base name: files}`` under ``tests``,
    paths relative to the repository."""
    defined: dict[str, set[str]] = {}
    files: dict[str, set[str]] = {}
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests.parent).as_posix()
        files.setdefault(path.name, set()).add(rel)
        for m in re.finditer(r"^\s*(?:async )?def ((?:test|sc)_\w+)", path.read_text(), re.M):
            defined.setdefault(m.group(1), set()).add(rel)
    return defined, files


@dataclasses.dataclass
class Section:
    parent: Section | None
    own: set[str] = dataclasses.field(default_factory=set)

    def files(self) -> set[str]:
        """The files this section names outside its rules, or its parent's."""
        if self.own or self.parent is None:
            return self.own
        return self.parent.files()


@dataclasses.dataclass
class Block:
    """A rule (``rule`` is its number) or a paragraph of prose, in its section."""

    rule: str | None
    text: str
    section: Section


def blocks(doc: str, files_in) -> list[Block]:
    """The rules and the paragraphs of prose of ``doc``; each section collects the files its
    prose names (``files_in(text)``), which its rules and paragraphs see once all is read."""
    out: list[Block] = []
    stack: list[tuple[int, Section]] = [(0, Section(None))]
    current: Block | None = None
    for line in doc.splitlines():
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            stack = [entry for entry in stack if entry[0] < level]
            stack.append((level, Section(stack[-1][1] if stack else None)))
            current = None
            continue
        section = stack[-1][1]
        start = RULE_START.match(line)
        if start:
            current = Block(start.group(1), line, section)
            out.append(current)
            continue
        if current is not None and current.rule is not None:
            if line.startswith(" ") or not line.strip():
                current.text += "\n" + line  # the rule's indented continuation
                continue
            current = None
        if not line.strip():
            current = None
            continue
        section.own |= files_in(line)
        if current is None:
            current = Block(None, line, section)
            out.append(current)
        else:
            current.text += "\n" + line
    return out


def problems(doc: str, tests: pathlib.Path) -> list[str]:
    """What is wrong with the tests ``doc`` names: a name defined nowhere or not where the doc
    says, a rule that names no test."""
    defined, by_base = definitions(tests)

    def files_in(text: str) -> set[str]:
        found: set[str] = set()
        for code in CODE.findall(text):
            for name in FILE.findall(code):
                found |= {name} if "/" in name else by_base.get(name, {f"(no file {name})"})
        return found

    found: list[str] = []
    for block in blocks(doc, files_in):
        where = files_in(block.text) | block.section.files()
        label = f"rule {block.rule}" if block.rule else f"paragraph {block.text[:40]!r}"
        named = 0
        for code in CODE.findall(block.text):
            qualified = QUALIFIED.fullmatch(code)
            if qualified:
                path, name = qualified.groups()
                if path in defined.get(name, set()) or path in defined.get("sc_" + name, set()):
                    named += 1
                else:
                    found.append(f"{label}: {code} is not defined there")
            elif TEST_NAME.fullmatch(code):
                homes = defined.get(code, set())
                if homes & where:
                    named += 1
                elif homes:
                    found.append(
                        f"{label}: {code} is in {sorted(homes)}, which it does not name "
                        f"(it names {sorted(where)}): name it with its file"
                    )
                else:
                    found.append(f"{label}: {code} is defined nowhere in tests/")
            elif SCENARIO_NAME.fullmatch(code) and defined.get("sc_" + code, set()) & where:
                named += 1
        if block.rule and not named:
            found.append(f"{label} names no test")
    return found


def test_every_rule_names_a_test_that_is_where_the_doc_says():
    doc = DOC.read_text()
    rules = [b.rule for b in blocks(doc, lambda text: set()) if b.rule is not None]
    # what the parser must see: the numbered rules of every section
    assert {"J1", "J31", "P7", "G10", "V1", "S10", "L15", "C13"} <= set(rules)
    assert len(rules) == len(set(rules)), sorted(r for r in rules if rules.count(r) > 1)
    assert problems(doc, ROOT / "tests") == []


def test_the_rules_are_numbered_one_way():
    """Each rule is its section's letter and its place in the section: J1, J2, ... V1, V2, ..."""
    rules = [b.rule for b in blocks(DOC.read_text(), lambda text: set()) if b.rule is not None]
    letters = list(dict.fromkeys(rule[0] for rule in rules))
    assert letters == list(SECTION_LETTERS), letters
    for letter in letters:
        numbers = [int(rule[1:]) for rule in rules if rule[0] == letter]
        assert numbers == list(range(1, len(numbers) + 1)), (letter, numbers)


def rule_references(text: str) -> list[str]:
    """The rules a text refers to (``rules J5-J30`` refers to J5 and J30)."""
    return [rule for m in RULE_REFERENCE.finditer(text) for rule in re.findall(_ID, m.group(1))]


def test_every_reference_to_a_rule_names_one_that_exists():
    rules = {b.rule for b in blocks(DOC.read_text(), lambda text: set()) if b.rule is not None}
    here = pathlib.Path(__file__).resolve()
    paths = [
        *(ROOT / "python").rglob("*.py"),
        *(ROOT / "python").rglob("*.pyi"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benches").rglob("*.py"),
        *(ROOT / "examples").rglob("*.py"),
        *(ROOT / "rust").rglob("*.rs"),
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "README.md",
    ]
    found = [
        f"{path.relative_to(ROOT)}: rule {rule}"
        for path in sorted(paths)
        if path != here and "_build" not in path.parts
        for rule in rule_references(path.read_text(encoding="utf-8"))
        if rule not in rules
    ]
    assert not found, "references to rules docs/semantics.md does not have:\n" + "\n".join(found)


def test_rule_references_are_read():
    text = "rule J31; rules J5-J30, rules J30 and L16 (rule\n    # P5) or rule 25a's; rule of thumb"
    assert rule_references(text) == ["J31", "J5", "J30", "J30", "L16", "P5", "25a"]


def test_the_check_finds_a_missing_a_misplaced_and_an_absent_test():
    doc = """# Doc
All of them live in `tests/policies/test_policies.py` unless another file is named.

## Section
J1. **Fine.** (`test_clone_caller_untouched`, `tests/policies/test_cycles.py::test_cycle_in_arguments_is_a_value_error`).
J2. **Missing.** (`test_that_does_not_exist`).
J3. **Misplaced.** (`test_cycle_in_arguments_is_a_value_error`).
J4. **Absent.** Nothing named.
J5. **Wrong file.** (`tests/policies/test_policies.py::test_cycle_in_arguments_is_a_value_error`).
"""  # noqa: E501
    found = problems(doc, ROOT / "tests")
    expected = [
        "rule J2: test_that_does_not_exist is defined nowhere in tests/",
        "rule J2 names no test",
        "rule J3: test_cycle_in_arguments_is_a_value_error is in "
        "['tests/policies/test_cycles.py'], which it does not name",
        "rule J3 names no test",
        "rule J4 names no test",
        "rule J5: tests/policies/test_policies.py::test_cycle_in_arguments_is_a_value_error is "
        "not defined there",
        "rule J5 names no test",
    ]
    assert len(found) == len(expected), found
    assert all(f.startswith(e) for f, e in zip(found, expected, strict=True)), found
