#!/bin/bash
# Build cost against n on synthetic OOD d=128 (issue 27): the graph kNN (knn-graph=128) against
# today's exact-kNN builder, in one run. Data: docs/bench/build-cost/synth-scale/README.md.
# At 8,192 training queries the graph kNN is the exact kNN (its floor), so that row is today's.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
B=${QKINDEX:-target/release/qkindex}
DATA=${DATA:-../data-synth}
OUT=${OUT:-bench-out/graph-knn}
EF=64,80,100,128,160,200,256,320,400,512,640,800,1024
mkdir -p "$OUT"
for n in 8192 32768 131072 524288; do
  kinds="attention:knn-graph=128"
  [ $n -le 8192 ] && kinds="attention"
  [ $n -gt 8192 ] && [ $n -le 131072 ] && kinds="attention,$kinds"
  $B bench --dump "$DATA/scale-n$n-d128" --kinds "$kinds" --queries q2k --k 100 --ef $EF \
     --repeat 1 --latency-samples 0 --out "$OUT/n$n" > "$OUT/n$n.log" 2>&1
  echo "n=$n done $(date)"
done
