"""Every bench script loads: its imports name modules and names that exist. The scripts CI does
not run whole (valgrind's ``call_instructions.py``, the device's ``floor_probe.py``, the
slower scaling and count scripts) still fail a test when the code they import moves."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted(
    p for p in HERE.glob("*.py") if not p.name.startswith(("test_", "conftest", "__init__"))
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_loads(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))  # the scripts import each other, as when run
    for name in {p.stem for p in HERE.glob("*.py")}:  # theirs, not tests/support's `trees`
        monkeypatch.delitem(sys.modules, name, raising=False)
    runpy.run_path(str(script), run_name="bench_script_loaded")  # not "__main__": no run
    assert "treeclone" in sys.modules
