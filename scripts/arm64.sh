#!/usr/bin/env bash
# aarch64 (ARM64): cross-builds index-core for aarch64-unknown-linux-gnu, runs its tests (the
# conformance suite and the kernel property tests) under qemu-aarch64, then checks that
# the bundled subset gives the same ids under emulation as on this x86 machine.
#
# rustup cannot fetch the aarch64 standard library here, so the cross toolchain is Debian's:
# rustc-web/cargo-web (a current stable rustc) with the arm64 build of libstd-rust-web-dev (its
# aarch64 std, through dpkg multiarch), gcc-aarch64-linux-gnu as the linker, and qemu-user.
# The host build (rustup's toolchain, $CARGO_TARGET_DIR) is untouched: the cross build has its own
# target directory and calls Debian's rustc and cargo by path.
#   bash scripts/arm64.sh                    # install if missing, build, emulated tests, ids check
#   ARM64_SKIP_INSTALL=1 bash scripts/arm64.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
HOST_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
ARM_TARGET_DIR="$HOST_TARGET_DIR/aarch64-cross"

if [ -z "${ARM64_SKIP_INSTALL:-}" ] && { [ ! -d /usr/lib/rustlib/$TARGET ] || ! command -v qemu-aarch64 >/dev/null \
    || ! command -v aarch64-linux-gnu-gcc >/dev/null; }; then
    echo "== install (Debian): rustc-web, cargo-web, libstd-rust-web-dev:arm64, gcc-aarch64-linux-gnu, qemu-user"
    dpkg --add-architecture arm64
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        rustc-web cargo-web libstd-rust-web-dev libstd-rust-web-dev:arm64 \
        libc6:arm64 libgcc-s1:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
/usr/bin/rustc --version
test -d /usr/lib/rustlib/$TARGET

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# No `-L /usr/aarch64-linux-gnu`: that loader (libc6-arm64-cross) with the multiarch libc6:arm64
# that ld.so.cache points to (another 2.36 build) spins forever in pthread_create. Without -L
# the binaries run on libc6:arm64's own loader and libraries.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
xcargo() {
    CARGO_TARGET_DIR="$ARM_TARGET_DIR" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
        /usr/bin/cargo "$1" --target $TARGET "${@:2}"
}

# index-core's unit tests, the conformance suite and the kernel property tests (the other
# integration tests run on x86 only: under emulation they would take most of CI's budget).
TESTS=(--lib --test conformance --test kernels)
echo "== cross build: index-core's tests and the recall_ids example for $TARGET"
start=$(date +%s)
xcargo test -p qkindex "${TESTS[@]}" --no-run
xcargo build -p qkindex --example recall_ids
echo "cross build: $(( $(date +%s) - start )) s"

echo "== index-core's tests under qemu-aarch64 (kernel sets: see 'kernel sets:' below)"
start=$(date +%s)
xcargo test -p qkindex --test kernels -- --nocapture scalar_set_is_always_available_and_last 2>&1 \
    | grep "kernel sets:"
xcargo test -p qkindex "${TESTS[@]}"
echo "emulated tests: $(( $(date +%s) - start )) s"

echo "== same ids on x86 and under emulation (bundled subset, layer 9 head 0)"
start=$(date +%s)
dump=data/smollm2-8k-subset
specs="${ARM64_SPECS:-flat,hnsw,vamana,ivf,attention}"
# --workspace: the host build's features, as scripts/test.sh built them (no dependency rebuild).
CARGO_TARGET_DIR="$HOST_TARGET_DIR" cargo build -q --workspace --examples
"$HOST_TARGET_DIR/debug/examples/recall_ids" $dump 9 0 "$specs" > "$ARM_TARGET_DIR/ids-x86.txt"
qemu-aarch64 "$ARM_TARGET_DIR/$TARGET/debug/examples/recall_ids" $dump 9 0 "$specs" \
    > "$ARM_TARGET_DIR/ids-aarch64.txt"
paste -d '\n' "$ARM_TARGET_DIR/ids-x86.txt" "$ARM_TARGET_DIR/ids-aarch64.txt"
# The first line names the kernel set (avx512 / avx2 / neon). NEON sums in the AVX-512 order, so
# against AVX-512 every line after it must match to the bit (ids and scores); against another x86
# set the reduction order differs, and only the recall must match.
if head -n 1 "$ARM_TARGET_DIR/ids-x86.txt" | grep -q "kernels avx512"; then
    diff <(tail -n +2 "$ARM_TARGET_DIR/ids-x86.txt") <(tail -n +2 "$ARM_TARGET_DIR/ids-aarch64.txt")
else
    echo "x86 kernels are not AVX-512: comparing recall only"
    diff <(tail -n +2 "$ARM_TARGET_DIR/ids-x86.txt" | cut -d, -f1) \
        <(tail -n +2 "$ARM_TARGET_DIR/ids-aarch64.txt" | cut -d, -f1)
fi
echo "ids check: $(( $(date +%s) - start )) s"
echo "scripts/arm64.sh: aarch64 build and emulated tests passed"
