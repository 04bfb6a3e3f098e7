#!/usr/bin/env bash
# issue 50: the decode default with prune=top, occlusion-fill, and the prune check, bracketing sweeps
set -euo pipefail
B=$1; OUT=$2; mkdir -p "$OUT"
DD="attention:causal=true,queries-per-key=1.25,global-full=0.1,far-check=0.04,auto-ef=0.95"
for set in smollm2-public-8k gemma3-public-16k; do
  "$B" bench --dump ${DATA:-../shared/data}/$set --kinds "$DD,prune=top,$DD,$DD,prune-check=top" \
     --queries q2k --k 100 --repeat 1 --latency-samples 0 --out "$OUT/$set" > "$OUT/$set.log" 2>&1
done
echo done > "$OUT/DONE"
