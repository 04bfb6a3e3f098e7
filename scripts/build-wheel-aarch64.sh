#!/usr/bin/env bash
# The aarch64 (ARM64) manylinux wheel of the Python package (index-py), cross-built on x86-64.
#
# The toolchain is scripts/arm64.sh's (Debian's rustc/cargo with the arm64 std, linker
# aarch64-linux-gnu-gcc; rustup cannot fetch the aarch64 std here). pyo3's abi3-py39 needs no
# aarch64 Python. maturin checks the wheel's glibc symbol versions itself and tags it with the
# oldest manylinux policy they allow (linking against Debian bookworm's arm64 glibc 2.36);
# with WHEEL_ZIG=1 it links through `zig cc` against glibc 2.17 stubs instead (manylinux2014;
# needs `pip install ziglang`; not tried yet: see docs/ARM64.md). The wheel is then checked
# by auditwheel and objdump -p.
#   bash scripts/build-wheel-aarch64.sh           # wheel in target/aarch64-cross/wheels
#   WHEEL_ZIG=1 bash scripts/build-wheel-aarch64.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
HOST_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
ARM_TARGET_DIR="$HOST_TARGET_DIR/aarch64-cross"
WHEELS="$ARM_TARGET_DIR/wheels"
PY="${PYTHON:-.venv/bin/python}"
test -d /usr/lib/rustlib/$TARGET || { echo "no aarch64 std: run scripts/arm64.sh first" >&2; exit 1; }

# maturin runs `cargo` and `rustc` (version and target queries) from PATH: Debian's, not rustup's.
bin="$ARM_TARGET_DIR/debian-bin"
mkdir -p "$bin" "$WHEELS"
ln -sf /usr/bin/cargo "$bin/cargo"
ln -sf /usr/bin/rustc "$bin/rustc"
export PATH="$bin:$PATH" CARGO=/usr/bin/cargo RUSTC=/usr/bin/rustc CARGO_TARGET_DIR="$ARM_TARGET_DIR"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
extra=()
if [ -n "${WHEEL_ZIG:-}" ]; then
    extra=(--zig --compatibility manylinux2014)
    export PATH="$(dirname "$PY"):$PATH"   # python -m ziglang
fi
rm -f "$WHEELS"/qkindex-*aarch64.whl
"$PY" -m maturin build --release --target $TARGET --manifest-path index-py/Cargo.toml \
    --out "$WHEELS" "${extra[@]}"
wheel=$(ls "$WHEELS"/qkindex-*manylinux*_aarch64.whl)
ls -l "$wheel"

echo "== auditwheel show"
"$PY" -m auditwheel show "$wheel"
echo "== the extension module: NEEDED libraries, highest glibc symbol version"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m zipfile -e "$wheel" "$tmp"
so=$(find "$tmp" -name '_native*.so')
aarch64-linux-gnu-objdump -p "$so" | grep -E 'NEEDED|file format'
aarch64-linux-gnu-objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1
if aarch64-linux-gnu-objdump -p "$so" | grep NEEDED | grep -q libpython; then
    echo "links libpython: not an abi3 extension" >&2
    exit 1
fi
echo "scripts/build-wheel-aarch64.sh: $(basename "$wheel")"
