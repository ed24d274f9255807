"""Two JAX processes on this machine train data-parallel under ``treeclone.jit`` (issue 13).

treeclone adds nothing distributed of its own: JAX's multi-controller runtime
(``jax.distributed.initialize``, a coordinator on 127.0.0.1, CPU devices, gloo collectives)
does the distribution, and this test checks that treeclone's policies do not get in its way.
Two worker processes (``tests/support/distributed_worker.py``, see its docstring) each expose
``DEVICES_PER_PROCESS`` CPU devices, so the global mesh has 4 devices over 2 processes; each
runs ``STEPS`` momentum-SGD steps on a batch split over all 4 devices, under every scenario
of the worker (``alias`` with the state updated in place and not returned, ``alias``
returning it, ``clone``, ``strict``, ``alias`` around a loss computed in a
``jax.shard_map`` with an explicit ``pmean``, ``treeclone.jit(alias)`` over
``treeclone.shard_map(alias)`` with the per-device function updating the state in place, and
on a 2-D ``data x model`` mesh, one row of devices per process, with the first layer's weights
split over ``model``: ``alias`` and a donated ``jit_partial``, each checking after every step
that every leaf of the caller's state is placed as it started, issue 48), and writes its
results. Here:

- both processes exit 0 within the time limit (each has checked the caller's dict inside:
  kept and updated under ``alias``, untouched under ``clone``, a ``MutationError`` under
  ``strict`` for the unreturned update);
- ``test_processes_agree``: both processes hold the same parameters, momentum, step count and
  losses, bit for bit (they ran one SPMD program and read the same replicated values);
- ``test_matches_single_process``: those equal a single-process run of the same steps under
  plain ``jax.jit`` on the whole batch (``distributed_worker.reference()``, computed in this
  process), to float32 tolerance (the all-reduce sums the gradients in another order).

The workers run once per module (a fixture) and are bounded: each attempt has a deadline,
after which (or once one worker has failed) every worker still running is killed, and a
failure shows both workers' output. The coordinator's address is a loopback this host can
open (127.0.0.1, else ::1; none: the module is skipped, saying why) and its port is found by
binding port 0; if it was taken in between (the coordinator cannot bind it), the run is
retried once on a new port.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import distributed_worker as worker
import numpy as np
import pytest
from helpers import SUPPORT_DIR, child_env

NUM_PROCESSES = 2
DEVICES_PER_PROCESS = 2
# One attempt: startup, compiling eight scenarios in each of two processes, three steps each.
# About 10 s on an idle 2-core machine; the rest is headroom for a loaded CI runner.
ATTEMPT_TIMEOUT = 120.0
# Once one worker has failed, how long the others get to fail by themselves (showing their
# own error) before they are killed.
GRACE_AFTER_FAILURE = 5.0
PORT_IN_USE = ("failed to start rpc server", "failed to add port", "address already in use")

RTOL = 1e-5
ATOL = 1e-6


# The loopback addresses the coordinator may listen on, in the order tried: IPv4 first (what
# JAX's own tests use), IPv6 where the host has no IPv4 loopback (a sandbox may lack either).
LOOPBACKS = (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6))
# Signs, in a worker's output, that its runtime opened a socket of a family the host lacks.
NO_SUCH_FAMILY = ("address family not supported", "eafnosupport")


def free_port() -> tuple[str, int]:
    """A loopback address this host can open and a free port on it, found by binding port 0
    (``(host, port)``; the host as ``jax.distributed`` takes it, IPv6 in brackets). Skips the
    module, saying why, when no loopback can be opened."""
    failures = []
    for host, family in LOOPBACKS:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
        except OSError as exc:
            failures.append(f"{host}: {exc}")
            continue
        return (f"[{host}]" if ":" in host else host), port
    pytest.skip(
        "two processes need a loopback socket for JAX's coordinator, and none can be opened "
        "on this host (" + "; ".join(failures) + ")"
    )


class Attempt:
    """One launch of the workers: their exit codes and output."""

    def __init__(self, out_dir: Path, address: tuple[str, int]) -> None:
        self.host, self.port = address
        self.out_dir = out_dir
        self.timed_out = False  # the attempt's deadline passed
        self.cut_short = False  # one worker failed and the others were killed after a grace
        env = child_env(
            XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}",
            PYTHONUNBUFFERED="1",
        )
        worker_path = os.path.join(SUPPORT_DIR, "distributed_worker.py")
        self.logs = [out_dir / f"process{i}.log" for i in range(NUM_PROCESSES)]
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for i, log in enumerate(self.logs):
                with open(log, "wb") as sink:  # a file, not a pipe: no worker blocks on output
                    self.procs.append(
                        subprocess.Popen(
                            [sys.executable, worker_path]
                            + [str(i), str(NUM_PROCESSES), str(self.port), str(out_dir)]
                            + [self.host],
                            stdout=sink,
                            stderr=subprocess.STDOUT,
                            env=env,
                            cwd=SUPPORT_DIR,
                        )
                    )
            self._wait()
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        self.returncodes = [proc.returncode for proc in self.procs]

    def _wait(self) -> None:
        deadline = time.monotonic() + ATTEMPT_TIMEOUT
        grace_end = None
        while any(proc.poll() is None for proc in self.procs):
            now = time.monotonic()
            if now > deadline:
                self.timed_out = True
                return
            if grace_end is None and any(p.returncode not in (None, 0) for p in self.procs):
                grace_end = now + GRACE_AFTER_FAILURE
            if grace_end is not None and now > grace_end:
                self.cut_short = True
                return
            time.sleep(0.05)

    @property
    def ok(self) -> bool:
        return not (self.timed_out or self.cut_short) and self.returncodes == [0] * NUM_PROCESSES

    def output(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    @property
    def no_such_family(self) -> bool:
        """Whether a worker failed opening a socket of a family the host lacks."""
        return not self.ok and any(
            sign in self.output(i).lower() for i in range(NUM_PROCESSES) for sign in NO_SUCH_FAMILY
        )

    @property
    def port_in_use(self) -> bool:
        text = self.output(0).lower()
        return not self.ok and any(sign in text for sign in PORT_IN_USE)

    def report(self) -> str:
        lines = [
            f"address {self.host}:{self.port}; exit codes {self.returncodes}"
            + (f"; still running after {ATTEMPT_TIMEOUT:.0f} s, killed" if self.timed_out else "")
            + (
                f"; one failed, the others killed {GRACE_AFTER_FAILURE:.0f} s later"
                if self.cut_short
                else ""
            )
        ]
        for i in range(NUM_PROCESSES):
            text = self.output(i)
            if len(text) > 8000:  # the Python error comes first, a runtime's abort dump after it
                text = f"{text[:4000]}\n[... {len(text) - 8000} characters ...]\n{text[-4000:]}"
            lines += [f"--- process {i} (stdout and stderr) ---", text]
        return "\n".join(lines)


def _refuse(families: set[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sockets of ``families`` fail to open, as on a host that lacks them."""
    real = socket.socket

    def opening(family: int = socket.AF_INET, *args, **kwargs):
        if family in families:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", opening)


def test_the_coordinator_falls_back_to_the_ipv6_loopback(monkeypatch: pytest.MonkeyPatch):
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"this host has no IPv6 loopback either: {exc}")
    _refuse({socket.AF_INET}, monkeypatch)
    host, port = free_port()
    assert host == "[::1]" and port > 0


def test_without_a_loopback_the_module_is_skipped_saying_why(monkeypatch: pytest.MonkeyPatch):
    _refuse({socket.AF_INET, socket.AF_INET6}, monkeypatch)
    with pytest.raises(
        pytest.skip.Exception, match=r"loopback.*none can be opened.*127\.0\.0\.1.*::1"
    ):
        free_port()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, np.ndarray]]:
    """Each process's results (the worker's npz: scenario + key path -> array)."""
    start = time.monotonic()
    attempt = Attempt(tmp_path_factory.mktemp("distributed"), free_port())
    failed = []
    if attempt.port_in_use:  # taken between free_port() and the coordinator's bind
        failed.append(attempt.report())
        attempt = Attempt(tmp_path_factory.mktemp("distributed"), free_port())
    if attempt.no_such_family:
        pytest.skip(
            f"JAX's distributed runtime opened a socket of a family this host lacks (on "
            f"{attempt.host}):\n{attempt.report()}"
        )
    if not attempt.ok:
        pytest.fail("\n\n".join([*failed, attempt.report()]))
    for i in range(NUM_PROCESSES):
        assert f"WORKER-OK {i}" in attempt.output(i), attempt.report()
    print(f"two-process run: {time.monotonic() - start:.1f} s")
    loaded = []
    for i in range(NUM_PROCESSES):
        with np.load(attempt.out_dir / f"process{i}.npz") as data:
            loaded.append(dict(data))
    return loaded


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    """The single-process run, flattened as the workers' results are."""
    return worker.flat(worker.reference())


def scenario_keys(result: dict[str, np.ndarray], scenario: str) -> dict[str, np.ndarray]:
    """The entries of one scenario, keyed by their key path alone."""
    return {
        key[len(scenario) :]: value
        for key, value in result.items()
        if key.startswith(scenario + "[")
    }


def test_every_scenario_ran(
    results: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray]
) -> None:
    expected = set(reference)
    for i, result in enumerate(results):
        for scenario in worker.SCENARIOS:
            keys = set(scenario_keys(result, scenario))
            assert keys == expected, f"process {i}, {scenario}: {sorted(keys ^ expected)}"
            assert int(result[f"{scenario}['step']"]) == worker.STEPS, (i, scenario)


def test_processes_agree(results: list[dict[str, np.ndarray]]) -> None:
    first, *others = results
    for i, other in enumerate(others, start=1):
        assert other.keys() == first.keys()
        for key, value in first.items():
            np.testing.assert_array_equal(other[key], value, err_msg=f"process {i} vs 0: {key}")


@pytest.mark.parametrize("scenario", list(worker.SCENARIOS))
def test_matches_single_process(
    results: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray], scenario: str
) -> None:
    for i, result in enumerate(results):
        got = scenario_keys(result, scenario)
        for key, want in reference.items():
            assert got[key].dtype == want.dtype, (i, scenario, key)
            np.testing.assert_allclose(
                got[key], want, rtol=RTOL, atol=ATOL, err_msg=f"process {i}, {scenario}{key}"
            )
