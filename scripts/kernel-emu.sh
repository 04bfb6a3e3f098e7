#!/usr/bin/env bash
# Runs the CUDA kernels on the CPU (threads as GPU threads, barriers as __syncthreads/__syncwarp):
#   kernels/emu/emulate.cpp    kernels/topk.cu against a brute-force top-k;
#   kernels/emu/llama_emu.cpp  kernels/llama.cu (RMSNorm, RoPE, SwiGLU, KV writes, attention and
#                              its online-softmax parts) against double-precision references.
# Needs g++ with C++20. Exits non-zero if either fails.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$dir"
flags=(-std=c++20 -O2 -pthread -Wall -Wno-unknown-pragmas)
g++ "${flags[@]}" -o "$dir/kernel-emu" kernels/emu/emulate.cpp
g++ "${flags[@]}" -o "$dir/kernel-emu-llama" kernels/emu/llama_emu.cpp
status=0
"$dir/kernel-emu" || status=1
"$dir/kernel-emu-llama" || status=1
exit "$status"
