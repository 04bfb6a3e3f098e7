#!/bin/bash
# Build cost against n on synthetic OOD d=128 (issue 27): the pooled kNN (knn-pool=16000), with
# and without prune-cands=128, against today's exact-kNN builder, in one run.
# Data: python3 ../shared/tools/synth_ood.py --out $DATA/scale-n$n-d128 --N $n --d 128 --M-test 200 --seed 0 --no-diag
# While a pool would hold a quarter of the keys (n <= 64K here) the pooled builder is the exact one.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
B=${QKINDEX:-target/release/qkindex}
DATA=${DATA:-../data-synth}
OUT=${OUT:-bench-out/pool-knn}
# 48 values of ef 6 % apart from 64 to 1,400 (pass 5's grid), for interpolated scanned fractions.
EF=$(python3 -c "
e=[];x=64.0
while x<=1400: e.append(int(round(x))); x*=1.06
print(','.join(map(str,sorted(set(e)))))")
mkdir -p "$OUT"
for n in ${SIZES:-8192 32768 131072 524288}; do
  $B bench --dump "$DATA/scale-n$n-d128" \
     --kinds "attention,attention:knn-pool=16000,attention:knn-pool=16000,prune-cands=128" \
     --queries q2k --k 100 --ef "$EF" --repeat 1 --latency-samples 0 --out "$OUT/n$n" > "$OUT/n$n.log" 2>&1
  echo "n=$n done $(date)"
done
