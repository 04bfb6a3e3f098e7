#!/usr/bin/env bash
# All tests: the Rust workspace (the CUDA kernels compiled to PTX by NVRTC from PyPI, and run on
# the CPU by an emulation harness; GPU tests skip with the reason where no GPU is usable), then the
# Python bindings (built into .venv with maturin; with torch and transformers for qkindex.hf)
# and the notebook examples on the bundled data.
# Works on a fresh clone with python3 + pip and g++. It fetches both model files first
# (scripts/get-model.sh --model all: SmolLM2 and Gemma 3, whose terms of use apply) and the long
# text (scripts/get-text.sh: Paul Graham's essays, MIT, into texts/), and ends
# with a list of every test that skipped and why (tests/support/skip.rs writes them to
# $QKINDEX_SKIP_LOG; cargo would otherwise swallow their prints).
#   bash scripts/test.sh            # everything
#   QKINDEX_SKIP_CARGO=1 bash scripts/test.sh   # only the Python part
#   QKINDEX_NO_FETCH=1 bash scripts/test.sh     # no model download: the model tests skip (listed)
#   QKINDEX_SHARED_DATA=../shared/data bash scripts/test.sh   # also the tests on data outside
#                                   # the repository (the directory holding smollm2-public-8k)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PY="${PYTHON:-python3}"

# Skip records: one line per skipped test (`crate::test: reason`), printed at the end whether the
# run passes or fails.
mkdir -p "$CARGO_TARGET_DIR"
export QKINDEX_SKIP_LOG="$CARGO_TARGET_DIR/test-skips.log"
: > "$QKINDEX_SKIP_LOG"
skip_summary() {
    local status=$?
    echo
    if [ -s "$QKINDEX_SKIP_LOG" ]; then
        echo "== skipped ($(sort -u "$QKINDEX_SKIP_LOG" | wc -l) distinct; a test that skips several cases counts once per reason):"
        sort "$QKINDEX_SKIP_LOG" | uniq -c | sed 's/^ *\([0-9]*\) \(.*\)/   \2  (x\1)/; s/  (x1)$//'
    else
        echo "== skipped: nothing"
    fi
    if [ "$status" -eq 0 ]; then
        echo "scripts/test.sh: all tests passed; $(sort -u "$QKINDEX_SKIP_LOG" | wc -l) skip records (above)"
    else
        echo "scripts/test.sh: FAILED (exit $status)"
    fi
}
trap skip_summary EXIT

if [ -z "${QKINDEX_NO_FETCH:-}" ]; then
    echo "== models: scripts/get-model.sh --model all (kept when present; QKINDEX_NO_FETCH=1 skips this)"
    bash scripts/get-model.sh --model all
    echo "== long text: scripts/get-text.sh (Paul Graham's essays into texts/; kept when present)"
    bash scripts/get-text.sh
else
    echo "script: QKINDEX_NO_FETCH is set: no model download (tests of a missing model skip)" >> "$QKINDEX_SKIP_LOG"
fi
if [ -z "${QKINDEX_SHARED_DATA:-}" ]; then
    echo "== QKINDEX_SHARED_DATA unset: the tests on data outside the repository skip (listed at the end)"
fi

echo "== Python: .venv with maturin, numpy, pytest, matplotlib, NVRTC (to compile the CUDA kernels) and ray (qkindex.distributed)"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "maturin>=1.9,<2" "numpy>=1.21" pytest matplotlib \
    "nvidia-cuda-nvrtc>=13,<14" "ray>=2.9"
# qkindex[hf] and what its tests and the notebook use: torch (PyPI's build, which runs on the
# CPU; about 3 GB the first time), transformers + gguf + accelerate (GGUF models), ml_dtypes
# (bfloat16 arrays), nbclient + ipykernel (the notebook, headless). QKINDEX_SKIP_TORCH=1 skips
# them: their tests then skip, saying why (and fail where CI is set).
if [ -z "${QKINDEX_SKIP_TORCH:-}" ]; then
    echo "== Python: torch, transformers, gguf, accelerate, ml_dtypes, nbclient, ipykernel"
    .venv/bin/python -m pip install --quiet "torch>=2.4" "transformers>=5.0,<6" "gguf>=0.10" \
        accelerate ml_dtypes nbclient nbformat ipykernel
fi
# The NVRTC library from PyPI: index-gpu's kernels_compile test compiles kernels/topk.cu to PTX
# with it (no GPU needed) and, with QKINDEX_REQUIRE_NVRTC=1, fails rather than skips without it.
nvrtc="$(find .venv -name 'libnvrtc.so.13' -path '*cu13*' | head -n 1)"
test -n "$nvrtc"
export LD_LIBRARY_PATH="$(cd "$(dirname "$nvrtc")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export QKINDEX_REQUIRE_NVRTC=1

if [ -n "${QKINDEX_SKIP_CARGO:-}" ]; then
    echo "script: cargo test --workspace and scripts/kernel-emu.sh: QKINDEX_SKIP_CARGO is set" >> "$QKINDEX_SKIP_LOG"
else
    echo "== floors: no file-level import cycle in model/src, driver/src/retrieval, index-core/src/attention"
    python3 scripts/check-floors.py --self-test
    python3 scripts/check-floors.py
    echo "== cargo test --workspace"
    cargo test --workspace --no-fail-fast
    echo "== CUDA kernels run on the CPU (scripts/kernel-emu.sh)"
    bash scripts/kernel-emu.sh
fi

echo "== maturin develop (index-py -> qkindex._native)"
# maturin installs the package into the active virtual environment.
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
    .venv/bin/maturin develop --manifest-path index-py/Cargo.toml ${QKINDEX_RELEASE:+--release}

echo "== pytest index-py/tests"
# -rs lists each skip with its reason; those lines join the summary.
pytest_log="$CARGO_TARGET_DIR/pytest.log"
.venv/bin/python -m pytest -q -rs index-py/tests 2>&1 | tee "$pytest_log"
{ grep '^SKIPPED' "$pytest_log" || true; } | sed 's/^SKIPPED \[[0-9]*\] /pytest::/' >> "$QKINDEX_SKIP_LOG"

echo "== examples/retrieval_attention.ipynb (headless through nbclient; needs torch and the model)"
if [ -n "${QKINDEX_SKIP_TORCH:-}" ]; then
    echo "script: examples/retrieval_attention.ipynb: QKINDEX_SKIP_TORCH is set (no torch)" >> "$QKINDEX_SKIP_LOG"
else
    QKINDEX_NB_OUT="$CARGO_TARGET_DIR/retrieval-attention" MPLBACKEND=Agg HF_HUB_OFFLINE=1 \
        .venv/bin/python scripts/run-notebook.py examples/retrieval_attention.ipynb \
        "$CARGO_TARGET_DIR/retrieval-attention/retrieval_attention.ipynb"
    test -s "$CARGO_TARGET_DIR/retrieval-attention/retrieval_attention.png"
fi

echo "== examples/notebook_quickstart.py (headless, small)"
MPLBACKEND=Agg .venv/bin/python examples/notebook_quickstart.py data/smollm2-8k-subset \
    --heads 0 --layers 9 --out "$CARGO_TARGET_DIR/quickstart"
test -s "$CARGO_TARGET_DIR/quickstart/recall_vs_scanned.png"
