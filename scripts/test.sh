#!/usr/bin/env bash
# All tests: the Rust workspace (the CUDA kernels compiled to PTX by NVRTC from PyPI, and run on
# the CPU by an emulation harness; GPU tests skip with the reason where no GPU is usable), then the
# Python bindings (built into .venv with maturin) and the notebook example on the bundled data.
# Works on a fresh clone with python3 + pip and g++.
#   bash scripts/test.sh            # everything
#   QKINDEX_SKIP_CARGO=1 bash scripts/test.sh   # only the Python part
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PY="${PYTHON:-python3}"

echo "== Python: .venv with maturin, numpy, pytest, matplotlib, and NVRTC (to compile the CUDA kernels)"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "maturin>=1.9,<2" "numpy>=1.21" pytest matplotlib \
    "nvidia-cuda-nvrtc>=13,<14"
# The NVRTC library from PyPI: index-gpu's kernels_compile test compiles kernels/topk.cu to PTX
# with it (no GPU needed) and, with QKINDEX_REQUIRE_NVRTC=1, fails rather than skips without it.
nvrtc="$(find .venv -name 'libnvrtc.so.13' -path '*cu13*' | head -n 1)"
test -n "$nvrtc"
export LD_LIBRARY_PATH="$(cd "$(dirname "$nvrtc")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export QKINDEX_REQUIRE_NVRTC=1

if [ -z "${QKINDEX_SKIP_CARGO:-}" ]; then
    echo "== cargo test --workspace"
    cargo test --workspace
    echo "== CUDA kernels run on the CPU (scripts/kernel-emu.sh)"
    bash scripts/kernel-emu.sh
fi

echo "== maturin develop (index-py -> qkindex._native)"
# maturin installs the package into the active virtual environment.
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
    .venv/bin/maturin develop --manifest-path index-py/Cargo.toml ${QKINDEX_RELEASE:+--release}

echo "== pytest index-py/tests"
.venv/bin/python -m pytest -q index-py/tests

echo "== examples/notebook_quickstart.py (headless, small)"
MPLBACKEND=Agg .venv/bin/python examples/notebook_quickstart.py data/smollm2-8k-subset \
    --heads 0 --layers 9 --out "$CARGO_TARGET_DIR/quickstart"
test -s "$CARGO_TARGET_DIR/quickstart/recall_vs_scanned.png"
echo "scripts/test.sh: all tests passed"
