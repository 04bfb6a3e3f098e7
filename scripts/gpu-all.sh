#!/usr/bin/env bash
# Every GPU check in one call (the device time of a session is short), from the prebuilt
# gpu-bundle/ (scripts/gpu-bundle.sh, run on the CPU machine first), then issue 47's table with
# every row against its goal in docs/gpu/issue47-<gpu>.json (scripts/gpu_table.py):
#   knn/     scripts/gpu-check.sh: kNN paths (fused, gemm, radix) vs the GEMM floor and chunked
#            torch.topk on the same GPU, correctness against the CPU
#   builds/  the attention build on 262,144 synthetic keys (d 128) and attention:knn-pool=16000,
#            both --device cuda (synthetic dump made here by shared/tools/synth_ood.py, numpy)
#   driver/  scripts/gpu-driver-check.sh: the CUDA model, prefill and decode, SDPA next to it
# Time: each stage runs under a timeout (knn 150 s, builds 90 s, driver 120 s), so the whole
# call ends within 6 minutes; a stage cut short leaves its rows `measured: null`, never guessed.
# --quick passes --quick to the checks (smaller shapes) and builds 65,536 keys.
#   bash scripts/gpu-all.sh OUTDIR [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu-all.sh OUTDIR [--quick]}"
quick="${2:-}"
status=0
mkdir -p "$out/builds"
started=$(date +%s)

timeout 150 bash scripts/gpu-check.sh "$out/knn" "$quick" || status=1

# shellcheck source=/dev/null
source scripts/gpu-libs.sh
synth=shared/tools/synth_ood.py
[ -f "$synth" ] || synth=../shared/tools/synth_ood.py
n=262144
[ "$quick" = "--quick" ] && n=65536
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
if timeout 40 python3 "$synth" --out "$out/builds/dump" --N "$n" --d 128 --no-diag \
        > "$out/builds/synth.log" 2>&1; then
    timed_build build-262k attention 25
    timed_build knn-pool attention:knn-pool=16000 25
else
    echo "FAILED: the synthetic dump ($synth; see builds/synth.log)"; status=1
fi

timeout 120 bash scripts/gpu-driver-check.sh "$out/driver" "$quick" || status=1

python3 scripts/gpu_table.py "$out" --out docs/gpu || status=1
echo "gpu-all.sh: $(( $(date +%s) - started )) s"
exit $status
