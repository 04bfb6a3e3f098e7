#!/usr/bin/env bash
# Every GPU check in one call (the device time of a session is short), from the prebuilt
# gpu-bundle/ (scripts/gpu-bundle.sh, run on the CPU machine first), then issue 47's table with
# every row against its goal in docs/gpu/issue47-<gpu>.json (scripts/gpu_table.py):
#   knn/     scripts/gpu-check.sh: kNN paths (fused, gemm, radix, auto) vs the GEMM floor and
#            chunked torch.topk on the same GPU, correctness against the CPU (--quick sizes)
#   builds/  the attention build on 262,144 synthetic keys (d 128) and attention:knn-pool=16000,
#            both --device cuda (synthetic dump made here by shared/tools/synth_ood.py, numpy)
#   driver/  scripts/gpu-driver-check.sh: the CUDA model, prefill and decode, SDPA next to it
#            (--quick sizes)
#   batch/   `qkindex --device cuda batch` past the CUDA model's 4 device KV caches
#            (CACHES_KEPT): batches of 4, 5 and 8 sequences, each its own cache, under full and
#            index-topk at 512 positions (it runs, no parity check); only where the model file
#            is here (models/ is git-ignored and over the carry limit: without it
#            batch/skipped.txt says so and nothing fails)
#   hf/      qkindex.hf on a random-weight Llama-3.2-1B-shaped model in bf16 (scripts/gpu_hf.py:
#            sdpa, exact-topk, index-topk, index-topk + offload at 32,768 and 131,072 tokens,
#            16 new tokens; no run starts after 100 seconds), JSON hf-<GPU>.json for docs/gpu/
# Time: each stage runs under a timeout (knn 75 s, builds 60 s, driver 75 s, batch 60 s, hf
# 150 s), so the whole call ends within 7 minutes; a stage cut short leaves its rows
# `measured: null` (or the runs gpu_hf.py lists as skipped), never guessed. --full runs knn and
# driver at their full sizes (about 8 more minutes: not for the 15-minute session budget).
#   bash scripts/gpu-all.sh OUTDIR [--full]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu-all.sh OUTDIR [--full]}"
size=--quick
t_knn=75 t_driver=75
if [ "${2:-}" = "--full" ]; then size="" t_knn=400 t_driver=400; fi
status=0
mkdir -p "$out/builds"
started=$(date +%s)

timeout "$t_knn" bash scripts/gpu-check.sh "$out/knn" $size || status=1

# shellcheck source=/dev/null
source scripts/gpu-libs.sh
synth=shared/tools/synth_ood.py
[ -f "$synth" ] || synth=../shared/tools/synth_ood.py
n=262144
# One build under `timeout`, timed; writes builds/NAME.json {ok, wall_s, rc, log}.
timed_build() {
    local name="$1" spec="$2" t0 t1 rc
    t0=$(date +%s.%N)
    timeout "$3" gpu-bundle/bin/qkindex --device cuda build --dump "$out/builds/dump" \
        --kind "$spec" --out "$out/builds/$name-bundle" > "$out/builds/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    python3 - "$out/builds/$name.json" "$rc" "$t0" "$t1" "$name.log" <<'PY'
import json, sys
path, rc, t0, t1, log = sys.argv[1:]
json.dump({"ok": rc == "0", "rc": int(rc), "wall_s": float(t1) - float(t0), "log": log},
          open(path, "w"), indent=2)
PY
    [ "$rc" = 0 ] || status=1
}
echo "== builds ($n synthetic keys, d 128)"
if timeout 25 python3 "$synth" --out "$out/builds/dump" --N "$n" --d 128 --no-diag \
        > "$out/builds/synth.log" 2>&1; then
    timed_build build-262k attention 17
    timed_build knn-pool attention:knn-pool=16000 17
else
    echo "FAILED: the synthetic dump ($synth; see builds/synth.log)"; status=1
fi

timeout "$t_driver" bash scripts/gpu-driver-check.sh "$out/driver" $size || status=1

# The CUDA model keeps 4 device KV caches; a batch of B sequences has B caches, so B > 4 evicts
# and re-uploads caches every step. This runs that path; it needs the model file.
echo "== batch decode past 4 device KV caches (qkindex --device cuda batch)"
mkdir -p "$out/batch"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$model" ]; then
    # 8 prompts of 504 tokens from the bundled text (about 8K tokens); sink and window as in
    # driver/tests/batch.rs, so that index-topk retrieves at this length.
    timeout 60 gpu-bundle/bin/qkindex --device cuda batch --model "$model" --context 512 \
        --new 8 --batch 4,5,8 --policy full,index-topk --no-reference --sink 16 --window 64 \
        --k 20 --json "$out/batch/batch.json" 2>&1 | tee "$out/batch/batch.log" || status=1
else
    echo "skipped: no $model on this machine (git-ignored, over the carry limit)" |
        tee "$out/batch/skipped.txt"
fi

echo "== qkindex.hf on the GPU (scripts/gpu_hf.py)"
mkdir -p "$out/hf"
site=/tmp/qkindex-site
if python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
        gpu-bundle/wheels/qkindex-*.whl; then
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout 150 \
        python3 scripts/gpu_hf.py --device cuda --time-limit 100 --out "$out/hf" \
        2>&1 | tee "$out/hf/hf.log" || status=1
else
    echo "FAILED: no qkindex wheel in gpu-bundle/wheels (scripts/gpu-bundle.sh builds it)"; status=1
fi

python3 scripts/gpu_table.py "$out" --out docs/gpu || status=1
echo "gpu-all.sh: $(( $(date +%s) - started )) s"
exit $status
