#!/usr/bin/env bash
# Every GPU check in one call (the device time of a session is short): the kNN backend
# (scripts/gpu-check.sh) and the model's CUDA backend (scripts/gpu-driver-check.sh), from the
# prebuilt gpu-bundle/ (scripts/gpu-bundle.sh, run on the CPU machine first). Under 8 minutes;
# --quick about two.
#   bash scripts/gpu-all.sh OUTDIR [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu-all.sh OUTDIR [--quick]}"
status=0
bash scripts/gpu-check.sh "$out/knn" "${2:-}" || status=1
bash scripts/gpu-driver-check.sh "$out/driver" "${2:-}" || status=1
exit $status
