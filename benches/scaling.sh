#!/usr/bin/env bash
# Scaling benchmark (issue "recall benchmark as a product"): cost at recall@100 >= 0.95 of
# AttentionIndex, IVF, HNSW (L2-reduced) and Flat on synthetic OOD dumps of growing size.
#
#   benches/scaling.sh [OUT_DIR] [DATA_DIR]
#
# Dumps come from ../shared/tools/synth_ood.py (seed 0), cached in DATA_DIR (default
# ../data-synth): n = 8K, 32K, 128K, 512K keys, d = 64 and 128, with as many training (prefill)
# queries as keys. Each size runs `qkindex bench --queries q2k` with the CPU-time clock (steady
# on a shared machine); `qkindex scaling` then writes OUT_DIR/scaling.md, scaling.json and plots.
# Builds are cached in CACHE_DIR (default OUT_DIR/cache): a second run only searches, so it can
# be repeated on an idle machine (the 512K builds take 7-15 minutes each on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/scaling}
DATA=${2:-../data-synth}
CACHE=${CACHE_DIR:-$OUT/cache}
GEN=${SYNTH_OOD:-../shared/tools/synth_ood.py}
SIZES=${SIZES:-"8192 32768 131072 524288"}
DIMS=${DIMS:-"64 128"}
BIN=target/release/qkindex
cargo build --release -p qkindex-driver --bin qkindex
mkdir -p "$OUT" "$DATA"
start=$(date +%s)
inputs=()
for d in $DIMS; do
  for n in $SIZES; do
    dump="$DATA/scale-n$n-d$d"
    if [ ! -f "$dump/manifest.json" ]; then
      python3 "$GEN" --out "$dump" --N "$n" --d "$d" --seed 0 --no-diag
    fi
    run="$OUT/n$n-d$d"
    "$BIN" bench --dump "$dump" --kinds attention,ivf,hnsw,flat --queries q2k --k 100 \
      --ef 64,72,80,90,100,110,120,128,144,160,192,224,256,320,400,512,640,800,1024,1280,1600,2048 \
      --nprobe 1,2,4,6,8,12,16,24,32,48,64,96,128,192,256,384,512 \
      --repeat 3 --latency-samples 768 --clock thread-cpu --cache "$CACHE" --out "$run" 2> "$run.log" || {
        echo "bench failed for n=$n d=$d (see $run.log)" >&2; exit 1; }
    inputs+=("$run/bench.json")
    echo "n=$n d=$d done at $(( $(date +%s) - start )) s"
  done
done
"$BIN" scaling "${inputs[@]}" --out "$OUT"
echo "scaling run: $(( $(date +%s) - start )) s wall in all"
