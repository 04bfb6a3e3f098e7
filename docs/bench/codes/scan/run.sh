#!/usr/bin/env bash
# Issue 26: the scans on int8 codes (flat:codes=i8, ivf:codes=i8) beside the graph walks and the
# peers, on the three data sets of the issue, one run each. Single thread, thread CPU clock,
# QPS from the median of 3 passes (one clock read per pass), recall@100 against the exact f32
# top-100. Usage: bash docs/bench/codes/scan/run.sh OUT [real45|gemma|synth]...
# Environment: QKINDEX (binary, default target/release/qkindex), VENV (python with faiss-cpu
# 1.15.1 for benches/peers.py, default benches/.venv-peers), SHARED (default ../shared),
# SYNTH (the synthetic 131K dump, default ../data-synth/scale-n131072-d128, made by
# python3 ../shared/tools/synth_ood.py --out $SYNTH --N 131072 --d 128 --M-test 200 --seed 0 --no-diag).
set -euo pipefail
out=${1:?usage: run.sh OUT [real45|gemma|synth]...}; shift
sets=${*:-real45 gemma synth}
Q=${QKINDEX:-target/release/qkindex}
VENV=${VENV:-benches/.venv-peers}
SHARED=${SHARED:-../shared}
SYNTH=${SYNTH:-../data-synth/scale-n131072-d128}
KINDS=attention,attention:codes=i8,attention:codes=i8-inline,flat:codes=i8,ivf,ivf:codes=i8
COMMON=(--queries q2k --repeat 3 --latency-samples 0 --clock thread-cpu)
PEERS=faiss-flat,faiss-ivf,faiss-ivfpq-fs,faiss-ivfpq-fs-refine
mkdir -p "$out"
for s in $sets; do
  case $s in
    real45) dump=$SHARED/data/smollm2-public-8k
            EF=64,80,100,110,120,128,160,192,256,320,400,512,640; NP=4,8,12,16,24,32,48,64,96,128 ;;
    gemma)  dump=$SHARED/data/gemma3-public-16k
            EF=100,128,160,192,256,320,400,512,640; NP=4,8,12,16,24,32,48,64,96,128,192 ;;
    synth)  dump=$SYNTH
            EF=100,128,160,192,256,320,400,512,640,800,1024; NP=8,16,32,64,96,128,192,256,384 ;;
    *) echo "unknown set $s" >&2; exit 2 ;;
  esac
  "$Q" bench --dump "$dump" --kinds "$KINDS" --ef "$EF" --nprobe "$NP" "${COMMON[@]}" --out "$out/$s"
  python3 benches/peers.py --venv "$VENV" --dump "$dump" --queries q2k --kinds "$PEERS" \
    --nprobe "$NP" --latency-samples 0 --clock thread-cpu --out "$out/$s/peers.json"
done
