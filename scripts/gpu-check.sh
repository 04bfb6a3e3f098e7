#!/usr/bin/env bash
# The GPU kNN checks on a CUDA 13 machine with PyTorch and no Rust toolchain, from the prebuilt
# gpu-bundle/ (scripts/gpu-bundle.sh). Writes into OUTDIR:
#   gpu.txt            nvidia-smi's view of the GPU
#   tests.log          index-gpu's test programs (GPU vs CPU on random data; they must not skip)
#   gpu-knn.json/.md   correctness against the CPU's precomputed top-k (random and real heads,
#                      both kernel paths), the measured GEMM rate, and 131,072² d=128 k=100
#                      against the GEMM floor
#   torch.json         chunked torch.topk(q @ k.T) on the same GPU and shape, same run
#   summary.json/.md   everything above in one place, with the ratio against PyTorch
# Under 4 minutes; --quick (32,768², fewer repetitions) under 1.
#   bash scripts/gpu-check.sh OUTDIR [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu-check.sh OUTDIR [--quick]}"
quick="${2:-}"
mkdir -p "$out"
bundle=gpu-bundle
status=0

# shellcheck source=/dev/null
source scripts/gpu-libs.sh
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee "$out/env.txt"
ldd --version 2>&1 | head -n 1 >> "$out/env.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

mode=()
n=131072
if [ "$quick" = "--quick" ]; then mode=(--quick); n=32768; fi

echo "== test programs"
: > "$out/tests.log"
for t in "$bundle"/bin/test-*; do
    echo "-- $t" >> "$out/tests.log"
    if ! timeout 120 "$t" --nocapture --test-threads 1 >> "$out/tests.log" 2>&1; then
        echo "FAILED: $t"; status=1
    fi
done
if grep -q "^skipped:" "$out/tests.log"; then
    echo "FAILED: GPU tests skipped on the GPU machine:"; grep "^skipped:" "$out/tests.log" | sort -u
    status=1
fi
grep -E "test result|FAILED|panicked" "$out/tests.log"

echo "== correctness and timing (qkindex-gpu-check run)"
timeout 200 "$bundle/bin/qkindex-gpu-check" run --cases "$bundle/cases" --out "$out" "${mode[@]}" \
    2>&1 | tee "$out/check.log" || status=1

echo "== PyTorch on the same GPU"
timeout 120 python3 scripts/gpu_torch_knn.py --n "$n" --d 128 --k 100 --out "$out/torch.json" \
    2>&1 | tee "$out/torch.log" || status=1

python3 - "$out" <<'PY' || status=1
import json, sys, os
out = sys.argv[1]
ours = json.load(open(os.path.join(out, "gpu-knn.json")))
torch = json.load(open(os.path.join(out, "torch.json")))
rows = []
for p in ours["performance"]:
    k_ms = p["timings"]["kernel_ms"]
    rows.append({"path": p["path"], "kernel_ms": k_ms, "wall_ms": p["timings"]["wall_ms"],
                 "kernel_over_floor": p["kernel_over_floor"],
                 "torch_ms": torch["median_ms"], "torch_over_ours": torch["median_ms"] / k_ms})
summary = {"device": ours["device"], "correct": ours["correct"], "gemm_rate": ours["gemm_rate"],
           "torch": torch, "paths": rows}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(f"# {ours['device']}: exact top-k, {torch['n']} queries x {torch['n']} keys, d {torch['d']}, k {torch['k']}\n\n")
    f.write("| path | kernel ms | x GEMM floor | PyTorch ms | PyTorch / ours |\n|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['path']} | {r['kernel_ms']:.2f} | {r['kernel_over_floor'] or float('nan'):.2f} | {r['torch_ms']:.2f} | {r['torch_over_ours']:.2f} |\n")
print(open(os.path.join(out, "summary.md")).read())
PY
exit $status
