#!/usr/bin/env bash
# Runs the CUDA kernels on the CPU (threads as GPU threads, barriers as __syncthreads/__syncwarp):
#   kernels/emu/emulate.cpp    kernels/topk.cu against a brute-force top-k (the radix path against
#                              the CPU's exact order, ties included);
#   kernels/emu/llama_emu.cpp  kernels/llama.cu (RMSNorm, RoPE, SwiGLU, KV writes, attention and
#                              its online-softmax parts) against double-precision references.
# Then deliberate bugs: each `mutants` entry below is one edit of kernels/topk.cu; the harness
# compiled against the edited copy must fail (a mutant that passes, or an edit that no longer
# applies, fails this script).
# Needs g++ with C++20. Exits non-zero if anything fails.
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

# name | exact text in kernels/topk.cu | its replacement (each applies once; the radix harness runs)
mutants=(
  "tie rule: higher ids first|(unsigned long long)(~id)|(unsigned long long)(id)"
  "threshold kept out|if (key >= lo) {|if (key > lo) {"
  "bin search off by one|if (above + hist[b] >= need) {|if (above + hist[b] > need) {"
  "early stop on a partial bin|s_done = hist[b] == need;|s_done = hist[b] >= need;"
  "causal mask off by one|long long visible = (long long)row0 + r + 1;|long long visible = (long long)row0 + r;"
  "bitonic direction|bool desc = (i & size) == 0;\n                    unsigned long long|bool desc = (i & size) != 0;\n                    unsigned long long"
)
mdir="$dir/kernel-emu-mutants"
mkdir -p "$mdir"
for entry in "${mutants[@]}"; do
  IFS='|' read -r name from to <<<"$entry"
  src="$mdir/topk.cu"
  if ! python3 - "$from" "$to" kernels/topk.cu "$src" <<'PY'
import sys
old, new, path, out = (a.encode().decode("unicode_escape") if i < 2 else a
                       for i, a in enumerate(sys.argv[1:]))
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"the edit's text occurs {text.count(old)} times")
open(out, "w").write(text.replace(old, new))
PY
  then
    echo "deliberate bug '$name': FAIL (the edit no longer applies to kernels/topk.cu)"
    status=1
    continue
  fi
  g++ "${flags[@]}" -DQK_TOPK_SOURCE="\"$src\"" -o "$mdir/kernel-emu" kernels/emu/emulate.cpp
  if "$mdir/kernel-emu" radix >"$mdir/log" 2>&1; then
    echo "deliberate bug '$name': FAIL (the harness did not catch it)"
    status=1
  else
    echo "deliberate bug '$name': caught ($(grep -c FAIL "$mdir/log") failing check(s))"
  fi
done
exit "$status"
