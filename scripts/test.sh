#!/usr/bin/env bash
# All tests: the Rust workspace, then the Python bindings (built into .venv with maturin) and
# the notebook example on the bundled data. Works on a fresh clone with python3 + pip.
#   bash scripts/test.sh            # everything
#   QKINDEX_SKIP_CARGO=1 bash scripts/test.sh   # only the Python part
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PY="${PYTHON:-python3}"

if [ -z "${QKINDEX_SKIP_CARGO:-}" ]; then
    echo "== cargo test --workspace"
    cargo test --workspace
fi

echo "== Python: .venv with maturin, numpy, pytest, matplotlib"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "maturin>=1.9,<2" "numpy>=1.21" pytest matplotlib

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
