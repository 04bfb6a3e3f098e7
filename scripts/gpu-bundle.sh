#!/usr/bin/env bash
# Prepares gpu-bundle/ for scripts/gpu-check.sh and scripts/gpu-driver-check.sh on a GPU machine
# without a Rust toolchain: stripped release binaries (the GPU kNN check, the qkindex CLI, and
# index-gpu's test programs), the Python package's wheel, the test cases with
# their CPU top-k (computed here), and nothing else. Run on the CPU machine, then carry
# gpu-bundle/ (ignored by git, ~40 MB) to the GPU machine with the working tree.
#   bash scripts/gpu-bundle.sh [DUMP]     # DUMP: a Q/K dump for the real-data cases
#                                         # (default ../shared/data/smollm2-public-8k if present)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
dump="${1:-../shared/data/smollm2-public-8k}"
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin"

cargo build --release -p qkindex-gpu --bin qkindex-gpu-check
cargo build --release -p qkindex-driver --bin qkindex
cp "$CARGO_TARGET_DIR/release/qkindex-gpu-check" "$CARGO_TARGET_DIR/release/qkindex" "$out/bin/"
# index-gpu's test programs, built in release (the names carry a hash: take them from cargo).
cargo test --release -p qkindex-gpu --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["target"]["kind"] != ["bin"]:
        name = m["target"]["name"].replace("-", "_")
        shutil.copy(exe, f"gpu-bundle/bin/test-{name}")
        print("test program:", name)
'
strip "$out"/bin/*
# The Python package (abi3 wheel, any CPython >= 3.9) for scripts/gpu_hf.py: the GPU machine
# has torch and transformers but no Rust toolchain.
maturin=maturin
if [ -x .venv/bin/maturin ]; then maturin=.venv/bin/maturin; fi
"$maturin" build --release --manifest-path index-py/Cargo.toml --out "$out/wheels"

if [ -d "$dump" ]; then
    "$out/bin/qkindex-gpu-check" prepare --out "$out/cases" --dump "$dump"
else
    echo "no dump at $dump: random cases only"
    "$out/bin/qkindex-gpu-check" prepare --out "$out/cases"
fi
echo "glibc needed: $(objdump -T "$out"/bin/* | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)"
du -sh "$out"
