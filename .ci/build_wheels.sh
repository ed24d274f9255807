#!/usr/bin/env bash
# treeclone's release build: an sdist, and from it one binary wheel per interpreter, each for
# manylinux_2_27 x86_64 or older (jaxlib's floor: glibc 2.27, so Ubuntu 18.04+, RHEL 8+).
#
#   bash .ci/build_wheels.sh [OUT_DIR [PYTHON...]]
#
# OUT_DIR: where the sdist and the wheels go (default: dist). PYTHON: the interpreters to build
# for (default: CPython 3.11, 3.12 and 3.13, each found in pyenv or on the PATH; the run fails
# when one is missing). Needs cargo (a rustup toolchain), python3 with venv, and PyPI the first
# time, for the build tools, which go into a venv of their own ($TOOLS, default
# target/wheel-tools): maturin, and ziglang, whose zig links the extension against glibc
# 2.27's symbols whatever this machine's glibc is (maturin --zig). The wheels are built from the
# unpacked sdist (maturin build --sdist), so the same run shows that the sdist builds; each
# wheel is then checked with `auditwheel show`, and the run fails unless it reports
# manylinux_2_27 or older. Cargo's target folder: $CARGO_TARGET_DIR, default target/.
# TOOLS_ONLY=1: install the build tools into $TOOLS and stop (.ci/run, before it starts another
# build with them beside this one).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT_DIR="${1:-dist}"
shift || true
GLIBC_MINOR=27
TOOLS="${TOOLS:-$ROOT/target/wheel-tools}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

# find_python 3.12: a working CPython 3.12 (pyenv's first, as .ci/run does; pyenv's shims on
# the PATH answer for the selected versions only), or nothing.
find_python() {
    local minor="$1" found="" v
    if command -v pyenv >/dev/null 2>&1; then
        v="$(pyenv versions --bare 2>/dev/null | grep -E "^${minor//./\\.}(\\.[0-9]+)?$" | tail -n 1 || true)"
        [ -z "$v" ] || found="$(pyenv root)/versions/$v/bin/python$minor"
    fi
    [ -n "$found" ] || found="$(command -v "python$minor" || true)"
    if [ -n "$found" ] && "$found" --version >/dev/null 2>&1; then
        echo "$found"
    fi
}

PYTHONS=("$@")
if [ "${#PYTHONS[@]}" -eq 0 ]; then
    for minor in 3.11 3.12 3.13; do
        py="$(find_python "$minor")"
        if [ -z "$py" ]; then
            echo "error: no Python $minor found (pyenv or python$minor on the PATH); name the" \
                "interpreters to build for after OUT_DIR" >&2
            exit 2
        fi
        PYTHONS+=("$py")
    done
fi

# The versions these wheels were checked with (auditwheel output in README, "Install").
[ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
"$TOOLS/bin/python" -m pip install -q --disable-pip-version-check \
    'maturin==1.16.0' 'ziglang==0.17.1' 'auditwheel==6.8.2'
# maturin runs zig as `python -m ziglang` with the first python on the PATH: the tools venv's.
export PATH="$TOOLS/bin:$PATH"
[ "${TOOLS_ONLY:-0}" = 0 ] || exit 0

# maturin writes the sdist's files with one fixed timestamp, and cargo keeps a path package's
# fingerprint by its path inside the package: a build from a newer sdist would then look fresh
# and reuse the last wheel build's extension. treeclone itself is always rebuilt (its
# dependencies stay cached).
cargo clean -q --release -p treeclone --target x86_64-unknown-linux-gnu

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
interpreters=()
for py in "${PYTHONS[@]}"; do interpreters+=(-i "$py"); done
maturin build --release --sdist --zig --compatibility "manylinux_2_$GLIBC_MINOR" \
    "${interpreters[@]}" -o "$STAGE"

for wheel in "$STAGE"/*.whl; do
    report="$(auditwheel show "$wheel" | tr '\n' ' ')"
    tag="$(grep -oE 'platform tag: "[^"]*"' <<<"$report" | head -n 1 | cut -d'"' -f2)"
    minor="$(sed -nE 's/^manylinux_2_([0-9]+)_x86_64$/\1/p' <<<"$tag")"
    if [ -z "$minor" ] || [ "$minor" -gt "$GLIBC_MINOR" ]; then
        echo "$report" >&2
        echo "error: $(basename "$wheel") is $tag by auditwheel, not manylinux_2_$GLIBC_MINOR" \
            "or older" >&2
        exit 1
    fi
    echo "auditwheel: $(basename "$wheel") is consistent with $tag"
done
mkdir -p "$OUT_DIR"
mv "$STAGE"/* "$OUT_DIR"/
ls -l "$OUT_DIR"
