"""A warm interpreter that runs each script in a forked copy of itself.

``helpers.run_script`` starts a fresh interpreter per script, so a crash fails one test instead
of killing pytest; but most of what such a child costs is importing JAX and treeclone (about
2.5 s of CPU each, for a few milliseconds of test). The hostile-input tests run many such
scripts, all with the same prelude. This server, one per pytest process, imports the prelude
once and then, for each script, forks: the script runs in a process of its own, from the very
state a fresh interpreter has after the prelude, and a segfault or an abort there kills only
that process, which the server reports as a negative exit code, as ``subprocess`` does.

Only the prelude's modules are imported before the fork (JAX's tree_util, treeclone's, numpy
under them), and nothing of JAX's runtime has started (no backend, no compile), so the child
is as a fresh one: whatever a script imports or registers happens in the child, in the order
the script says. Scripts that need their own environment or import order (sharded devices,
registration before import) keep ``run_script``.

Run as ``python forkserver.py``: it reads requests from stdin, one JSON line each
(``{"code", "stdout", "stderr", "timeout"}``, the output file paths given by the caller), and
writes one JSON line per request: ``{"returncode"}``, or ``{"timeout": true}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

PRELUDE_MODULES = ("jax.tree_util", "treeclone.tree_util")


def _run_child(code: str, stdout: str, stderr: str) -> None:
    """In the forked child: run ``code`` as ``__main__`` with its output in the two files."""
    import faulthandler
    import traceback

    for fd, path in ((1, stdout), (2, stderr)):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, fd)
        os.close(out)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the child exits with os._exit)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115
    faulthandler.enable()  # a crash prints every thread's Python stack to stderr
    status = 0
    try:
        exec(compile(code, "<script>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:  # a message: printed, exit code 1, as the interpreter does
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 (reported as an interpreter reports it)
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter shutdown: its atexit hooks and finalizers belong to the server's state.
    os._exit(status)


def _wait(pid: int, timeout: float) -> dict:
    """The child's exit as ``subprocess`` reports it (``-signal`` when killed by one)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"timeout": True}
        time.sleep(0.002)


def serve() -> None:
    import importlib

    for name in PRELUDE_MODULES:
        importlib.import_module(name)
    replies = sys.stdout
    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(request["code"], request["stdout"], request["stderr"])
        print(json.dumps(_wait(pid, request["timeout"])), file=replies, flush=True)


if __name__ == "__main__":
    serve()
