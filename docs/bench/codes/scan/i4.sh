#!/usr/bin/env bash
# Issue 26: the scans on 4-bit codes beside the same scans on int8 codes, one run per data set
# (same flags as run.sh; no peers: compare with run.sh's runs through the int8 rows).
# Usage: bash docs/bench/codes/scan/i4.sh OUT [real45|gemma|synth]...
set -euo pipefail
out=${1:?usage: i4.sh OUT [real45|gemma|synth]...}; shift
sets=${*:-real45 gemma synth}
Q=${QKINDEX:-target/release/qkindex}
SHARED=${SHARED:-../shared}
SYNTH=${SYNTH:-../data-synth/scale-n131072-d128}
KINDS=flat:codes=i8,flat:codes=i4,ivf:codes=i8,ivf:codes=i4
COMMON=(--queries q2k --repeat 3 --latency-samples 0 --clock thread-cpu)
mkdir -p "$out"
for s in $sets; do
  case $s in
    real45) dump=$SHARED/data/smollm2-public-8k; EF=100,110,120,128,160,192,256,320,400; NP=4,8,12,16,24,32,48,64,96,128 ;;
    gemma)  dump=$SHARED/data/gemma3-public-16k; EF=100,128,160,192,256,320,400; NP=4,8,12,16,24,32,48,64,96,128 ;;
    synth)  dump=$SYNTH; EF=100,128,160,192,256,320,400,512; NP=8,16,32,64,96,128,192,256,362 ;;
    *) echo "unknown set $s" >&2; exit 2 ;;
  esac
  "$Q" bench --dump "$dump" --kinds "$KINDS" --ef "$EF" --nprobe "$NP" "${COMMON[@]}" --out "$out/$s"
done
