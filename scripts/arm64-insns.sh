#!/usr/bin/env bash
# Instructions per inner product of the NEON kernels and of the x86 AVX-512 and AVX2 ones, from
# the generated release code (no ARM hardware here, so no speed figures; docs/ARM64.md).
#
# Builds index-core's `kernel_insns` example in release twice: for the host (rustup's toolchain,
# target/release) and for aarch64 (Debian's rustc, target/aarch64-cross, as scripts/arm64.sh).
# Then, by scripts/insns.py:
#   - static: the hot loop of each kernel in `objdump -d -C --no-show-raw-insn` (the innermost
#     backward branch whose body holds the most vector multiplies, in the function its Kernels
#     pointer points to or in what that one calls; `kernel_insns ISA addrs` gives the pointers):
#     instructions per iteration, and its elements (the f32 lanes of its FMAs);
#   - dynamic: the instructions one call executes at d = 64, 128, 256 (aarch64: every executed
#     instruction logged by `qemu-aarch64 -singlestep -d nochain,exec`; x86: `gdb` stepi from the
#     entry of the call to its return, on this CPU). For gather and range, the cost of one more
#     row: (call with 16 rows - call with 8 rows) / 8.
# From those: instructions per element = (IP(256) - IP(128)) / 128 (gather: with the row's
# prefetch), and the fixed part of an inner product (call, setup, reduction) = IP(128) - 128 ·
# per-element. The int8 rows have no f32 FMA: their elements per iteration are
# 128 · iteration / (IP(256) - IP(128)).
#   bash scripts/arm64-insns.sh                 # build, disassemble, count; prints the tables
#   ARM64_INSNS_SKIP_BUILD=1 bash scripts/arm64-insns.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
HOST_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
ARM_TARGET_DIR="$HOST_TARGET_DIR/aarch64-cross"
OUT="$ARM_TARGET_DIR/insns"
mkdir -p "$OUT"

if [ -z "${ARM64_INSNS_SKIP_BUILD:-}" ]; then
    echo "== release builds of the kernel_insns example (host, $TARGET)" >&2
    CARGO_TARGET_DIR="$HOST_TARGET_DIR" cargo build -q --release -p qkindex --example kernel_insns
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CARGO_TARGET_DIR="$ARM_TARGET_DIR" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
        /usr/bin/cargo build -q --release --target $TARGET -p qkindex --example kernel_insns
fi
X86_BIN="$HOST_TARGET_DIR/release/examples/kernel_insns"
ARM_BIN="$ARM_TARGET_DIR/$TARGET/release/examples/kernel_insns"

objdump -d -C --no-show-raw-insn "$X86_BIN" > "$OUT/x86_64.txt"
aarch64-linux-gnu-objdump -d -C --no-show-raw-insn "$ARM_BIN" > "$OUT/aarch64.txt"
# Every kernel-symbol loop with vector multiplies (for reading), then each kernel's hot loop.
python3 scripts/insns.py loops "$OUT/x86_64.txt" x86_64 > "$OUT/loops-x86_64.tsv"
python3 scripts/insns.py loops "$OUT/aarch64.txt" aarch64 > "$OUT/loops-aarch64.tsv"

# The x86 sets this CPU has (the AVX-512 ones need an AVX-512 machine; otherwise they are left out).
x86_sets=$("$X86_BIN" avx512 dot_f32 16 1 1 >/dev/null 2>&1 && echo avx512 || true)
x86_sets="$x86_sets avx2"
i8_sets=""
for s in avx512-vnni avx2; do
    "$X86_BIN" $s dot_q8 16 1 1 >/dev/null 2>&1 && i8_sets="$i8_sets $s"
done

counts="$OUT/counts.tsv"
: > "$counts"
measure() { # tool binary isa kernel
    local d rows c8 c16
    for d in 64 128 256; do
        case $4 in
        gather_* | range_*)
            c8=$(python3 scripts/insns.py "$1" "$2" "$3" "$4" $d 8)
            c16=$(python3 scripts/insns.py "$1" "$2" "$3" "$4" $d 16)
            echo -e "$3\t$4\t$d\t$(python3 -c "print(($c16 - $c8) / 8)")" >> "$counts" ;;
        *)
            echo -e "$3\t$4\t$d\t$(python3 scripts/insns.py "$1" "$2" "$3" "$4" $d 1)" >> "$counts" ;;
        esac
    done
}
echo "== counting (qemu-aarch64 -singlestep; gdb stepi)" >&2
for k in dot_f32 dot_f16 gather_f32 gather_f16 range_f32 range_f16; do
    measure qemu "$ARM_BIN" neon $k
    for s in $x86_sets; do measure gdb "$X86_BIN" $s $k; done
done
# int8: NEON has no int8 set; on aarch64 these are the scalar kernels as the compiler built them.
for k in dot_i8 dot_q8; do
    measure qemu "$ARM_BIN" scalar $k
    for s in $i8_sets; do measure gdb "$X86_BIN" $s $k; done
done
hot="$OUT/hot.tsv"
python3 scripts/insns.py hot "$ARM_BIN" aarch64 "$OUT/aarch64.txt" neon > "$hot"
python3 scripts/insns.py hot "$ARM_BIN" aarch64 "$OUT/aarch64.txt" scalar >> "$hot"
for s in $x86_sets $i8_sets; do python3 scripts/insns.py hot "$X86_BIN" x86_64 "$OUT/x86_64.txt" $s >> "$hot"; done
python3 scripts/insns.py table "$counts" "$hot"
