"""Smoke tests of the training-loop benchmark harness (``python -m treeclone.bench``).

Each test runs the harness in a subprocess on a small subset of workloads with ``--quick``
and checks what it writes: ``results.json``, ``report.md`` and ``bench.png`` (or the reason
there is no chart), and a status for every contender of every workload run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import child_env
from treeclone.bench.contenders import BASELINE, GROUPS

STATUSES = {"ok", "skipped", "not applicable", "failed", "error"}


def _run(out: Path, *args: str, prelude: str = "") -> subprocess.CompletedProcess:
    """``python -m treeclone.bench --quick --out OUT ...``; ``prelude`` runs first."""
    code = (
        f"{prelude}\nimport sys\nfrom treeclone.bench.__main__ import main\n"
        f"sys.exit(main({['--quick', '--out', str(out), *args]!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=child_env()
    )


def _check_files(out: Path, workloads: list[str]) -> dict:
    assert (out / "report.md").is_file()
    results = json.loads((out / "results.json").read_text())
    if results["plot"].startswith("none"):
        assert "matplotlib" in results["plot"] or "nothing" in results["plot"]
    else:
        assert (out / "bench.png").stat().st_size > 0
    assert list(results["workloads"]) == workloads
    report = (out / "report.md").read_text()
    for name in workloads:
        wl = results["workloads"][name]
        assert set(wl["contenders"]) == set(GROUPS[wl["group"]].contenders), name
        for contender, res in wl["contenders"].items():
            assert res["status"] in STATUSES, (name, contender, res)
            assert f"`{contender}`" in report
        for key in ("python", "jax", "jaxlib", "flax", "equinox", "optax", "treeclone"):
            assert key in results["machine"]
        assert "--quick" in results["command"]
    return results


def test_quick_run_writes_every_file_and_status(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    workloads = ["mlp_adam", "seed_pattern"]
    proc = _run(out, "--only", "mlp_adam", "--only", "seed_pattern")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _check_files(out, workloads)
    for name in workloads:
        base = results["workloads"][name]["contenders"][BASELINE]
        # jax.jit is the baseline: it must pass its check and be timed.
        assert base["status"] == "ok", base
        assert base["median_us"] > 0 and base["ratio_to_jax_jit"] == 1.0
        assert base["traces"] == 1
        assert len(base["check_losses"]) == results["config"]["check_steps"]
        for res in results["workloads"][name]["contenders"].values():
            if res["status"] == "ok":
                assert res["median_us"] > 0 and res["q1_us"] <= res["q3_us"]
            else:
                assert res["detail"], res  # every non-ok status says why
    # The progress bar goes to stderr; stdout stays clean.
    assert "%" in proc.stderr
    _check_from_results(tmp_path, results)


def _check_from_results(tmp_path: Path, results: dict) -> None:
    """--from-results merges runs of disjoint workloads (a device run split into commands)
    into one report and writes it into the docs section of the runs' platform."""
    from treeclone.bench.__main__ import main
    from treeclone.bench.report import END, section_markers

    assert results["platform"] == "cpu"
    paths = []
    for name in results["workloads"]:  # one file per workload, as if run on a TPU
        part = {**results, "platform": "tpu", "workloads": {name: results["workloads"][name]}}
        part["machine"] = {**results["machine"], "git revision": f"rev-{name}"}
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(part))
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\ncpu section\n{END}\n")
    out = tmp_path / "merged"
    assert main(["--from-results", *map(str, paths), "--out", str(out), "--docs", str(doc)]) == 0
    begin, end = section_markers("tpu")
    text = doc.read_text()
    assert text.startswith(f"# Benchmarks\n\ncpu section\n{END}\n") and text.count(begin) == 1
    section = text[text.index(begin) : text.index(end)]
    assert (out / "report.md").read_text().count("\n## `") == len(results["workloads"])
    for name in results["workloads"]:
        assert f"#### `{name}`" in section
    assert section.count(" ; python -m treeclone.bench") == len(paths) - 1
    # Details the runs differ in are given per run, naming its workloads.
    revisions = "; ".join(f"rev-{name} (`{name}`)" for name in results["workloads"])
    assert f"- git revision: {revisions}\n" in section
    # The same workload in two runs is refused, not silently overwritten.
    assert main(["--from-results", str(paths[0]), str(paths[0]), "--out", str(out)]) == 2


def test_missing_peers_are_reported_not_dropped(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    # flax and equinox unimportable, treeclone.jit gone: all must still be in the results.
    prelude = (
        "import sys\nsys.modules['flax'] = None\nsys.modules['equinox'] = None\n"
        "import treeclone\nif hasattr(treeclone, 'jit'):\n    del treeclone.jit"
    )
    proc = _run(out, "--only", "mlp_adam", "--rounds", "1", prelude=prelude)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _check_files(out, ["mlp_adam"])
    contenders = results["workloads"]["mlp_adam"]["contenders"]
    assert contenders[BASELINE]["status"] == "ok"
    for name in ("flax.nnx.jit", "equinox.filter_jit"):
        assert contenders[name]["status"] == "skipped"
        assert contenders[name]["detail"] == "not installed"
    for policy in ("clone", "alias", "strict"):
        res = contenders[f"treeclone.jit[{policy}]"]
        assert res["status"] == "skipped"
        assert res["detail"].startswith("treeclone.jit not available")
    report = (out / "report.md").read_text()
    assert "skipped (not installed)" in report


def test_docs_section_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    from treeclone.bench.report import BEGIN, END, write_section

    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Title\n\n<!-- tree-table:begin -->\ntable\n<!-- tree-table:end -->\n")
    write_section(doc, "first\n")
    text = doc.read_text()
    assert text.startswith("# Title\n") and "<!-- tree-table:end -->" in text
    assert text.endswith(f"{BEGIN}\nfirst\n{END}\n")
    write_section(doc, "second\n")
    text = doc.read_text()
    assert "first" not in text and text.count(BEGIN) == 1 and "second" in text
    assert "<!-- tree-table:begin -->\ntable\n" in text


def test_nnx_overhead_workload_runs_every_nnx_mode_and_the_floor(tmp_path: Path) -> None:
    from treeclone.bench.contenders import EQX, FLOOR, PEERS

    out = tmp_path / "bench"
    proc = _run(out, "--only", "nnx_empty_20", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _check_files(out, ["nnx_empty_20"])
    wl = results["workloads"]["nnx_empty_20"]
    for contender, res in wl["contenders"].items():
        if contender == EQX:
            assert res["status"] == "not applicable"
        else:  # nnx graph and tree mode, both jit_partials, the floor: all run and are timed
            assert res["status"] == "ok", (contender, res)
            assert res["ratio_to_floor"] > 0 and res["ratio_to_peer"] > 0
    assert wl["fastest_peer"] in PEERS
    assert wl["contenders"][FLOOR]["ratio_to_floor"] == 1.0
    report = (out / "report.md").read_text()
    assert "| *fastest peer* |" in report and "vs floor" in report


def test_a_run_under_load_says_its_numbers_are_noisy() -> None:
    from treeclone.bench.report import noise_warning

    timing = {"median_us": 100.0, "q1_us": 95.0, "q3_us": 105.0}
    results = {"workloads": {"w": {"contenders": {"jax.jit": timing}}}}
    assert noise_warning({**results, "load": {"cores": 2, "before": 0.2, "after": 0.3}}) == ""
    loaded = noise_warning({**results, "load": {"cores": 2, "before": 3.5, "after": 3.0}})
    assert loaded.startswith("**Noisy run**") and "3.50 on 2 cores" in loaded
    spread = {"median_us": 100.0, "q1_us": 70.0, "q3_us": 130.0}
    noisy = {"workloads": {"w": {"contenders": {"jax.jit": spread}}}}
    assert "60%" in noise_warning(noisy)


def test_a_runner_whose_timed_wait_misses_an_output_array_is_not_timed() -> None:
    import jax.numpy as jnp
    from treeclone.bench.contenders import Availability
    from treeclone.bench.harness import Config, _check
    from treeclone.bench.workloads import STANDARD, Runner, TraceCounter

    loss, w = jnp.ones(()), jnp.zeros(2)
    outputs = (loss, {"w": w, "name": "relu"})

    class OneRunner:  # a workload whose only runner is the one given
        def __init__(self, arrays):
            self.arrays = arrays

        def runner(self, contender, jit):
            return Runner(run=lambda n: outputs, traces=TraceCounter(), arrays=self.arrays)

    def check(arrays) -> dict:
        res: dict = {}
        cfg = Config(rounds=1, steps=1, check_steps=2, rtol=1e-6, atol=0.0)
        av = Availability(wrappers={BASELINE: lambda f: f})
        _check(OneRunner(arrays), BASELINE, av, cfg, res, {STANDARD: {"losses": [1.0, 1.0]}})
        return res

    assert check(lambda out: [out[0], out[1]["w"]])["status"] == "ok"
    assert check(None)["status"] == "ok"  # waits on the outputs themselves
    missed = check(lambda out: [out[0]])
    assert missed["status"] == "failed"
    assert missed["detail"] == "the runner's arrays() misses 1 of the outputs' arrays"


def test_the_floor_ends_where_the_plain_loop_does_and_keeps_what_the_step_leaves() -> None:
    """The floor's loop (positional arrays, a flat tuple out, the next tuple gathered from the
    old one and the outputs) ends with the plain loop's arrays; a leaf the step leaves alone
    is the caller's own array after every call; one trace."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from treeclone.bench.workloads import floor_runner

    def on_state(state, x, y):
        state = dict(state)
        state["a"] = state["a"] * x + state["frozen"].sum()
        state["b"] = state["b"] + y
        return state["b"] * 2, state

    state = {"a": jnp.arange(3.0), "frozen": jnp.ones(2), "b": jnp.zeros(())}
    runner = floor_runner(jax.jit, on_state, state, jnp.float32(2.0), jnp.float32(1.0))
    want = state
    for steps in (1, 4):
        loss, leaves = runner.run(steps)
        for _ in range(steps):
            want_loss, want = on_state(want, 2.0, 1.0)
        assert float(loss) == float(want_loss)
        got = [np.asarray(v).tolist() for v in leaves]
        assert got == [np.asarray(v).tolist() for v in jax.tree.leaves(want)]
        assert leaves[2] is state["frozen"]  # the leaves in key order: a, b, frozen
    assert runner.traces.n == 1


def test_donated_and_equinox_workloads_run_every_contender_to_jax_jit_s_state(
    tmp_path: Path,
) -> None:
    """CI's smoke run of the donated group and the equinox group: each contender traced and
    run once at the tiny sizes on each form of step (transformer_adam_donated runs
    mlp_adam_donated's forms, so it is left out here), its losses and final state checked
    against the un-jitted run and its group's jax.jit (none may fail), every ratio to the
    group's baseline and floor, one headline table per group, and each group's own section
    of the docs written, the training one kept."""
    from treeclone.bench.__main__ import main
    from treeclone.bench.contenders import DONATED, EQUINOX
    from treeclone.bench.report import section_markers
    from treeclone.bench.workloads import WORKLOADS

    out = tmp_path / "bench"
    args = ["--tiny", "--rounds", "1", "--steps", "1", "--check-steps", "2"]
    names = ["mlp_adam_donated", "nnx_train_20_donated", "frozen_half_donated", "eqx_mlp_adam"]
    groups = [n for n, w in WORKLOADS.items() if w.group in (DONATED, EQUINOX)]
    assert groups == [*names[:3], "transformer_adam_donated", names[3]]
    proc = _run(out, "--only", ",".join(names), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _check_files(out, names)
    assert results["config"]["tiny"] is True
    for name in names:
        wl = results["workloads"][name]
        group = GROUPS[wl["group"]]
        for contender, res in wl["contenders"].items():
            assert res["status"] == "ok", (name, contender, res)
            assert res["ratio_to_jax_jit"] > 0 and res["ratio_to_floor"] > 0
            assert not any("donated buffers" in n for n in res["notes"]), (contender, res)
        assert wl["contenders"][group.baseline]["ratio_to_jax_jit"] == 1.0
        assert wl["contenders"][group.floor]["ratio_to_floor"] == 1.0
    eqx = results["workloads"]["eqx_mlp_adam"]
    assert eqx["fastest_peer"] == "equinox.filter_jit"
    assert eqx["contenders"]["equinox.filter_jit"]["ratio_to_peer"] == 1.0
    report = (out / "report.md").read_text()
    assert "| vs jax.jit[donate] | vs fastest peer | vs floor[donate] |" in report
    assert f"{DONATED.title}: " in report and f"{EQUINOX.title}: " in report

    doc = tmp_path / "benchmarks.md"
    kept = f"{section_markers('cpu')[0]}\ntraining table\n{section_markers('cpu')[1]}\n"
    doc.write_text(f"# Benchmarks\n\n{kept}")
    merged = tmp_path / "merged"
    json_path = str(out / "results.json")
    assert main(["--from-results", json_path, "--out", str(merged), "--docs", str(doc)]) == 0
    text = doc.read_text()
    assert kept in text  # the training group's section is not this run's
    for group, first in ((DONATED, "mlp_adam_donated"), (EQUINOX, "eqx_mlp_adam")):
        begin, end = section_markers("cpu", group.section)
        section = text[text.index(begin) : text.index(end)]
        assert f"#### `{first}`" in section and group.title in section
    # A tiny run is never written into the docs.
    assert main(["--tiny", "--only", "mlp_adam", "--docs", str(doc), "--out", str(merged)]) == 2


def test_only_takes_a_group_s_name_for_its_workloads() -> None:
    from treeclone.bench.__main__ import expand_only, main

    donated = [
        "mlp_adam_donated",
        "nnx_train_20_donated",
        "frozen_half_donated",
        "transformer_adam_donated",
    ]
    assert expand_only(["donated,equinox"]) == [*donated, "eqx_mlp_adam"]
    assert expand_only(["mlp_adam", " equinox ,"]) == ["mlp_adam", "eqx_mlp_adam"]
    assert "nnx_train_100" in expand_only(["training"])
    assert main(["--only", "equinox,nope"]) == 2  # before running anything


@pytest.mark.parametrize("option", ["--rounds", "--steps", "--check-steps"])
def test_a_count_of_zero_is_refused_before_anything_runs(option: str, capsys) -> None:
    """0 is a count given, not the default: refused with the usage error (exit 2), as a
    negative count is (``--steps 0`` divided by zero in the timing before)."""
    from treeclone.bench.__main__ import main

    for value in ("0", "-1"):
        assert main(["--only", "mlp_adam", option, value]) == 2
        assert "must be at least 1" in capsys.readouterr().err


def test_a_contender_whose_final_state_differs_from_jax_jit_s_is_not_timed() -> None:
    """The losses agree, the state after the check steps does not: the check fails, naming
    the array; the baseline's own state is what the others are compared with; a contender of
    another semantics is not compared."""
    import jax.numpy as jnp
    from treeclone.bench.contenders import TC_ALIAS, TRAINING, Availability
    from treeclone.bench.harness import Config, _check
    from treeclone.bench.workloads import STANDARD, TIED, Runner, TraceCounter

    class Fixed:  # a workload whose runners end in the state given
        def __init__(self, state, semantics=STANDARD):
            self.state, self.semantics = state, semantics

        def runner(self, contender, jit):
            return Runner(
                run=lambda n: (jnp.ones(()), self.state),
                traces=TraceCounter(),
                state=lambda: self.state,
                semantics=self.semantics,
            )

    cfg = Config(rounds=1, steps=1, check_steps=2, rtol=1e-6, atol=0.0)
    av = Availability(wrappers={BASELINE: lambda f: f, TC_ALIAS: lambda f: f})
    refs = {STANDARD: {"losses": [1.0, 1.0]}, TIED: {"losses": [1.0, 1.0]}}
    baseline: dict = {}

    def check(contender, state, semantics=STANDARD) -> dict:
        res: dict = {}
        _check(Fixed(state, semantics), contender, av, cfg, res, refs, baseline, TRAINING)
        return res

    want = {"w": jnp.arange(3.0), "b": jnp.zeros(())}
    assert check(BASELINE, want)["status"] == "ok"
    assert check(TC_ALIAS, {"w": jnp.arange(3.0), "b": jnp.zeros(())})["status"] == "ok"
    off = check(TC_ALIAS, {"w": jnp.arange(3.0) + 1e-3, "b": jnp.zeros(())})
    assert off["status"] == "failed"
    assert off["detail"].startswith("its final state differs from jax.jit's: array 1 of 2")
    fewer = check(TC_ALIAS, {"w": jnp.arange(3.0)})
    assert fewer["detail"] == "its final state has 1 arrays, jax.jit's 2: not the same state"
    assert check(TC_ALIAS, {"w": jnp.ones(5)}, semantics=TIED)["status"] == "ok"


def test_the_donated_floor_donates_only_what_the_step_replaces() -> None:
    """The floor with donation ends where the plain loop does; the arrays the step replaces
    are donated (deleted after the call, as under jax.jit) and a leaf it leaves alone is the
    caller's own array, alive; one counted trace (the trace ahead that finds the replaced
    arrays is not counted)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from treeclone.bench.workloads import floor_runner

    def on_state(state, x, y):
        state = dict(state)
        state["a"] = state["a"] * x + state["frozen"].sum()
        state["b"] = state["b"] + y
        return state["b"] * 2, state

    state = {"a": jnp.arange(3.0), "frozen": jnp.ones(2), "b": jnp.zeros(())}
    a0, b0 = state["a"], state["b"]
    runner = floor_runner(jax.jit, on_state, state, jnp.float32(2.0), jnp.float32(1.0), donate=True)
    # Not from the arrays given: a NumPy view of a CPU array stops its donation.
    want = {"a": np.arange(3.0), "frozen": np.ones(2), "b": np.zeros(())}
    loss, leaves = runner.run(3)
    for _ in range(3):
        want_loss, want = on_state(want, 2.0, 1.0)
    assert float(loss) == float(want_loss)
    assert [np.asarray(v).tolist() for v in leaves] == [
        np.asarray(v).tolist() for v in jax.tree.leaves(want)
    ]
    assert a0.is_deleted() and b0.is_deleted()
    assert leaves[2] is state["frozen"] and not state["frozen"].is_deleted()
    assert jax.tree.leaves(runner.state()) == list(leaves)
    assert runner.traces.n == 1
