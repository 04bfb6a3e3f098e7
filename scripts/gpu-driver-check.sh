#!/usr/bin/env bash
# The driver's CUDA backend on a CUDA 13 machine with PyTorch and no Rust toolchain, from the
# prebuilt gpu-bundle/ (scripts/gpu-bundle.sh). Writes into OUTDIR:
#   gpu-driver.json   parity with the CPU backend (logits, 64 greedy steps), prefill tokens/s,
#                     decode ms/token (full, index-topk) with the GPU/CPU overlap split, the
#                     attention kernels alone
#   torch-sdpa.json   PyTorch's scaled_dot_product_attention at the same shapes, same GPU
#   driver-summary.md the two side by side
# The model file is used when models/ has it, else a seeded random-weight model of its shape.
# Under 4 minutes; --quick (2K context) about one.
#   bash scripts/gpu-driver-check.sh OUTDIR [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu-driver-check.sh OUTDIR [--quick]}"
quick="${2:-}"
mkdir -p "$out"
status=0
# shellcheck source=/dev/null
source scripts/gpu-libs.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1

mode=()
n=8128
if [ "$quick" = "--quick" ]; then mode=(--quick); n=2048; fi
echo "== qkindex gpu-check"
timeout 220 gpu-bundle/bin/qkindex gpu-check --out "$out" "${mode[@]}" 2>&1 | tee "$out/driver.log" || status=1
echo "== PyTorch SDPA"
timeout 60 python3 scripts/gpu_torch_sdpa.py --n "$n" --out "$out/torch-sdpa.json" 2>&1 | tee -a "$out/driver.log" || status=1
python3 - "$out" <<'PY' || status=1
import json, os, sys
out = sys.argv[1]
d = json.load(open(os.path.join(out, "gpu-driver.json")))
t = json.load(open(os.path.join(out, "torch-sdpa.json")))
a = d["attention_kernels"]
with open(os.path.join(out, "driver-summary.md"), "w") as f:
    f.write(f"# {d['backend']}: {d['model']}\n\n")
    p = d["parity"]
    f.write(f"Parity: logits rel. error {p['logits_rel_err']:.2e}; greedy tokens identical for {p['greedy_steps_identical']}/{p['greedy_steps']} steps\n\n")
    f.write(f"Prefill {d['prefill']['tokens']} tokens: {d['prefill']['tokens_per_s']:.0f} tokens/s\n\n")
    f.write("| policy | ms/token | GPU static ms | CPU search ms | wait ms |\n|---|---|---|---|---|\n")
    for r in d["decode"]:
        s = r["split"]
        f.write(f"| {r['policy']} | {r['ms_per_token']:.2f} | {s['gpu_static_ms']:.2f} | {s['cpu_search_ms']:.2f} | {s['wait_ms']:.2f} |\n")
    f.write("\n| attention (f32) | ours ms | PyTorch SDPA ms |\n|---|---|---|\n")
    f.write(f"| causal prefill, {a['keys']} tokens | {a['prefill_causal_ms']:.3f} | {t['prefill_causal_ms']:.3f} |\n")
    f.write(f"| one decode query, {a['keys']} keys | {a['decode_one_query_ms']:.3f} | {t['decode_one_query_ms']:.3f} |\n")
print(open(os.path.join(out, "driver-summary.md")).read())
PY
exit $status
