#!/usr/bin/env bash
# Every GPU check in one call (the device time of a session is short), from the prebuilt
# gpu-bundle/ (scripts/gpu-bundle.sh, run on the CPU machine first):
#   knn/     the kNN backend (scripts/gpu-check.sh --quick: 32,768², under 1 minute)
#   driver/  the model's CUDA backend (scripts/gpu-driver-check.sh --quick: 2K context, about 1)
#   hf/      qkindex.hf on a random-weight Llama-3.2-1B-shaped model in bf16 (scripts/gpu_hf.py:
#            sdpa, exact-topk, index-topk, index-topk + offload at 32,768 and 131,072 tokens,
#            16 new tokens; no run starts after 170 seconds, about 4 minutes in all with
#            the model's start), JSON hf-<GPU>.json for docs/gpu/
# Under 6 minutes in all. --full runs the first two at their full sizes instead (8 more minutes).
#   bash scripts/gpu-all.sh OUTDIR [--full]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu-all.sh OUTDIR [--full]}"
size=--quick
if [ "${2:-}" = "--full" ]; then size=""; fi
status=0
bash scripts/gpu-check.sh "$out/knn" $size || status=1
bash scripts/gpu-driver-check.sh "$out/driver" $size || status=1

echo "== qkindex.hf on the GPU (scripts/gpu_hf.py)"
mkdir -p "$out/hf"
site=/tmp/qkindex-site
if python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
        gpu-bundle/wheels/qkindex-*.whl; then
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout 300 \
        python3 scripts/gpu_hf.py --device cuda --time-limit 170 --out "$out/hf" \
        2>&1 | tee "$out/hf/hf.log" || status=1
else
    echo "FAILED: no qkindex wheel in gpu-bundle/wheels (scripts/gpu-bundle.sh builds it)"; status=1
fi
exit $status
