#!/usr/bin/env bash
# Run the training-loop benchmarks (python -m treeclone.bench) on an NVIDIA GPU machine.
#
#   bash benches/gpu_run.sh [WHEEL] [OUT_DIR]
#
# For a machine with no network where Python 3.12 already has jax[cuda], flax, equinox and
# optax (matplotlib optional: without it the report says there is no chart). Installs the
# treeclone wheel with `pip install --no-deps --no-index`, prints the GPU (nvidia-smi) and
# jax.devices(), then runs the full harness on the GPU.
#
#   WHEEL    a treeclone wheel for CPython 3.12 (default: the newest dist/treeclone-*cp312*.whl,
#            else the newest dist/treeclone-*.whl)
#   OUT_DIR  where results.json, report.md and bench.png go (default: $OUT if set, else
#            bench-out)
#
# Environment: PYTHON (default python3), BENCH_ARGS (more harness options, e.g. "--quick"),
# BENCH_TIMEOUT (seconds, default 280: the harness writes its results after every workload,
# so a run cut short still leaves the workloads done so far).
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

if [ -z "$WHEEL" ]; then
    WHEEL="$(newest 'dist/treeclone-*cp312*.whl')"
    [ -n "$WHEEL" ] || WHEEL="$(newest 'dist/treeclone-*.whl')"
fi
if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
    echo "error: no treeclone wheel: pass its path, or put one for CPython 3.12 in dist/" >&2
    exit 2
fi

section "python"
"$PY" --version

section "install $WHEEL (no dependencies, no index)"
if ! "$PY" -m pip install --no-deps --no-index --force-reinstall "$WHEEL"; then
    # An externally managed or read-only interpreter: install next to it instead.
    SITE="$(mktemp -d)"
    echo "note: installing into $SITE (on PYTHONPATH) instead" >&2
    "$PY" -m pip install --no-deps --no-index --target "$SITE" "$WHEEL"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c 'import treeclone; print("treeclone", treeclone.__version__, "from", treeclone.__file__)'

section "nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
else
    echo "nvidia-smi not found"
fi

section "jax.devices()"
"$PY" -c 'import jax; print(jax.__version__, jax.default_backend(), jax.devices())'

section "python -m treeclone.bench --out $OUT_DIR ${BENCH_ARGS:-}"
mkdir -p "$OUT_DIR"
rc=0
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-280}" "$PY" -m treeclone.bench --out "$OUT_DIR" ${BENCH_ARGS:-} || rc=$?
if [ "$rc" -eq 124 ]; then
    echo "error: the harness ran past ${BENCH_TIMEOUT:-280} s; partial results in $OUT_DIR" >&2
fi

section "report ($((SECONDS - START)) s in all)"
if [ -f "$OUT_DIR/report.md" ]; then
    cat "$OUT_DIR/report.md"
fi
ls -l "$OUT_DIR"
exit "$rc"
