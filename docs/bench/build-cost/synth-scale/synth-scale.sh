#!/bin/bash
# Build cost against n on synthetic OOD d=128: the cheap builder at every n, today's up to 131K.
cd "$(dirname "$0")/../../../.."
B=target/release/qkindex
EF=64,80,100,128,160,200,256,320,400,512,640,800,1024
for n in 8192 32768 131072 524288; do
  kinds="attention:queries-per-key=1,prune-cands=128,knn-probe=64"
  [ $n -le 131072 ] && kinds="attention,$kinds"
  $B bench --dump ../data-synth/scale-n$n-d128 --kinds "$kinds" --queries q2k --k 100 --ef $EF \
     --repeat 1 --latency-samples 64 --clock thread-cpu --out bench-out/synth-scale/n$n > bench-out/synth-scale/n$n.log 2>&1
  echo "n=$n done $(date)"
done
