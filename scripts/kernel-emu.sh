#!/usr/bin/env bash
# Runs the CUDA kernels of kernels/topk.cu on the CPU (kernels/emu/emulate.cpp: threads as GPU
# threads, barriers as __syncthreads/__syncwarp) against a brute-force top-k. Needs g++ with C++20.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${CARGO_TARGET_DIR:-$PWD/target}/kernel-emu"
mkdir -p "$(dirname "$out")"
g++ -std=c++20 -O2 -pthread -Wall -Wno-unknown-pragmas -o "$out" kernels/emu/emulate.cpp
"$out"
