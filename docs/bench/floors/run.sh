#!/usr/bin/env bash
# Usage: run.sh BIN OUTDIR [BENCH_FLAGS]: index files (sha256), bench rows and eval JSON for the
# before/after check of issue 43. A binary with bracketing sweeps (issue 50) takes
# BENCH_FLAGS=--no-bracket to measure the grid an older binary measures.
set -euo pipefail
BIN=$(realpath "$1"); OUT=$(realpath -m "$2"); FLAGS=${3:-}; mkdir -p "$OUT/files"
cd "$(dirname "$0")/../../.."
for kind in attention "attention:codes=i8-inline" "attention:causal=true,queries-per-key=1.25,global-full=0.1,far-check=0.04,auto-ef=0.95" "attention:knn-pool=200" flat "flat:codes=i8" "flat:codes=i4" hnsw hnsw-ip ivf ivf-ip "ivf:codes=i8" vamana robust-vamana; do
  d="$OUT/files/$(echo "$kind" | tr ':,=' '___')"
  "$BIN" build --dump data/smollm2-8k-subset --layers 9 --heads 0,1 --kind "$kind" --out "$d" --device cpu > "$d.log" 2>&1 || { echo "build $kind failed"; cat "$d.log"; }
done
(cd "$OUT/files" && find . -type f ! -name '*.log' | sort | xargs sha256sum) > "$OUT/hashes.txt"
"$BIN" bench --dump data/smollm2-8k-subset --kinds all --repeat 1 --latency-samples 0 $FLAGS --out "$OUT/bench" > "$OUT/bench.log" 2>&1
"$BIN" eval --context 2048 --continuation 64 --policy full,static,exact-topk,index-topk,retopk --no-reference --device cpu --json "$OUT/eval.json" > "$OUT/eval.log" 2>&1
echo done > "$OUT/DONE"
