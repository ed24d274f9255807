#!/usr/bin/env bash
# Run the training-loop benchmarks (python -m treeclone.bench), the test suite, or both, on an
# accelerator machine (an NVIDIA GPU or a TPU) that has no network and already has JAX for its
# accelerator, against an installed treeclone wheel.
#
#   bash benches/device_run.sh [WHEEL] [OUT_DIR]
#
# Installs the treeclone wheel, the wheels in $WHEELS and the packages in $PACKAGES (from the
# local index $INDEX) into one folder put at the END of PYTHONPATH, so the machine's own JAX
# stays the one imported; prints the accelerator and jax.devices() (also into
# OUT_DIR/machine.txt), then runs the harness and the tests asked for.
#
#   WHEEL    a treeclone wheel for the machine's Python (default: the newest
#            dist/treeclone-*-cpXY-*.whl for that Python, else the newest dist/treeclone-*.whl)
#   OUT_DIR  where results.json, report.md, bench.png, machine.txt and the tests' tests.log
#            and tests.xml go (default: $OUT if set, else bench-out)
#
# Environment: PYTHON (default python3); WHEELS (a folder of more wheels, installed with no
# dependencies and no index, e.g. equinox); INDEX (a local package index such as
# file:///opt/pypi/simple) and PACKAGES (installed from it with their dependencies, default
# "flax optax"; nothing is installed from an index without INDEX); BENCH_ARGS (more harness
# options, e.g. "--only mlp_adam --rounds 9"); BENCH_TIMEOUT (seconds, default 280: the
# harness writes its results after every workload, so a run cut short keeps what it did);
# TREECLONE_REVISION (the revision the report names: the wheel's, e.g. `git rev-parse --short
# HEAD` where it was built; default: the git state of this copy of the tree); HARNESS=0 (skip
# the harness); PROBE (a bench script and its arguments, run after the harness with the same
# packages, e.g. "benches/release_probe.py --out OUT_DIR/release.md"; OUT_DIR is replaced by
# the output folder); TESTS (pytest arguments: the suite, run after the harness against the
# installed wheel, from this folder, where python/ is not importable, in ONE pytest process,
# since one process at a time can hold a TPU; the tests that start Python children keep them
# on the CPU; its log goes to OUT_DIR/tests.log; TESTS_TIMEOUT seconds, default 540). The
# tests need pytest and hypothesis (and flax, optax, equinox for their files): name them in
# PACKAGES or WHEELS where the machine's Python lacks them.
#
#   bash benches/device_run.sh dist/treeclone-*cp312*.whl              # the H200 machine
#   WHEELS=.whl-tpu INDEX=file:///opt/pypi/simple bash benches/device_run.sh   # a TPU machine
#   HARNESS=0 TESTS="-v tests/jit" TESTS_TIMEOUT=530 \
#       WHEELS=.whl-tpu INDEX=file:///opt/pypi/simple \
#       PACKAGES="flax optax jaxtyping wadler-lindig pytest hypothesis" \
#       bash benches/device_run.sh dist/treeclone-*-cp311-*.whl   # a part of the suite on the TPU
# (docs/site/development.md, "Tested versions"; .whl-tpu holds equinox's wheel: pip download
# --no-deps equinox==0.13.8, which the machine's index lacks). The whole suite takes about 35
# minutes of the TPU v5e in four such runs, each under the 10-minute limit of a command:
# tests/tree_util; tests/hostile tests/bench tests/distributed and tests/test_*.py;
# tests/jit; tests/policies tests/transforms (-v names each file, so a run cut short says
# where it stopped).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
WHEEL="${1:-}"
OUT_DIR="${2:-${OUT:-bench-out}}"
START=$SECONDS

section() {
    printf '\n==== [%4ds] %s ====\n' "$((SECONDS - START))" "$*"
}

newest() {
    # The newest file matching the glob in $1 (nothing if none).
    # shellcheck disable=SC2086
    ls -t $1 2>/dev/null | head -n 1 || true
}

section "python"
"$PY" -c 'import platform, sys; print(sys.version.split()[0], "glibc", platform.libc_ver()[1])'
TAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
if [ -z "$WHEEL" ]; then
    WHEEL="$(newest "dist/treeclone-*-$TAG-*.whl")"
    [ -n "$WHEEL" ] || WHEEL="$(newest 'dist/treeclone-*.whl')"
fi
if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
    echo "error: no treeclone wheel: pass its path, or put one for $TAG in dist/" >&2
    exit 2
fi

SITE="$(mktemp -d)"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE"
pip_install() {
    PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --isolated -q --no-compile --no-cache-dir \
        --disable-pip-version-check --upgrade --target "$SITE" "$@"
}
section "install $WHEEL ${WHEELS:+and $WHEELS/*.whl }into $SITE (end of PYTHONPATH)"
# shellcheck disable=SC2046
pip_install --no-index --no-deps "$WHEEL" $([ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl)
if [ -n "${INDEX:-}" ]; then
    section "install ${PACKAGES:-flax optax} from $INDEX"
    # shellcheck disable=SC2086
    pip_install --only-binary=:all: --index-url "$INDEX" ${PACKAGES:-flax optax}
fi
# The wheel's treeclone, not a source tree's: what the suite below tests.
"$PY" -c 'import sys, treeclone; print("treeclone", treeclone.__version__, "from", treeclone.__file__); sys.exit(not treeclone.__file__.startswith(sys.argv[1]))' "$SITE"
"$PY" -c 'import jax, flax, optax, equinox; print(*(f"{m.__name__} {m.__version__}" for m in (jax, flax, optax, equinox)))' || true

section "accelerator"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
fi
mkdir -p "$OUT_DIR"
# Also in OUT_DIR/machine.txt: the record of what a run ran on, beside its results.
"$PY" -c 'import jax; print(jax.__version__, jax.default_backend(), jax.devices())' |
    tee "$OUT_DIR/machine.txt"
rc=0
if [ "${HARNESS:-1}" != 0 ]; then
    section "python -m treeclone.bench --out $OUT_DIR ${BENCH_ARGS:-}"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-280}" "$PY" -m treeclone.bench --out "$OUT_DIR" ${BENCH_ARGS:-} || rc=$?
    if [ "$rc" -eq 124 ]; then
        echo "error: the harness ran past ${BENCH_TIMEOUT:-280} s; partial results in $OUT_DIR" >&2
    fi
fi
if [ -n "${PROBE:-}" ]; then
    section "python ${PROBE//OUT_DIR/$OUT_DIR}"
    # shellcheck disable=SC2086
    "$PY" ${PROBE//OUT_DIR/$OUT_DIR} || rc=$?
fi
if [ -n "${TESTS:-}" ]; then
    section "python -m pytest $TESTS (on JAX's default backend)"
    test_rc=0
    # shellcheck disable=SC2086
    timeout "${TESTS_TIMEOUT:-540}" "$PY" -m pytest -q -rfEs -p no:cacheprovider \
        --durations=10 --junitxml "$OUT_DIR/tests.xml" $TESTS 2>&1 |
        tee "$OUT_DIR/tests.log" || test_rc=$?
    if [ "$test_rc" -eq 124 ]; then
        echo "error: the tests ran past ${TESTS_TIMEOUT:-540} s; what ran: $OUT_DIR/tests.log" >&2
    fi
    [ "$test_rc" -eq 0 ] || rc=$test_rc
fi

section "report ($((SECONDS - START)) s in all)"
if [ -f "$OUT_DIR/report.md" ]; then
    cat "$OUT_DIR/report.md"
fi
ls -l "$OUT_DIR"
exit "$rc"
