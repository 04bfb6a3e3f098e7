"""Teacher-forced perplexity and decode speed of retrieval attention in SmolLM2-135M run by
Hugging Face transformers (CPU): full attention against ``static``, ``exact-topk`` and
``index-topk`` (``qkindex.hf.RetrievalAttention``), on the bundled subset's prompt ids.

    HF_HUB_OFFLINE=1 python examples/hf_retrieval_ppl.py --context 4096 --decode 128 \\
        --out docs/bench/hf-retrieval/ppl-4k.json

Each policy runs its own prefill of ``--context`` tokens (exact attention; ``index-topk``
builds its indexes at its end), then ``--decode`` one-token steps, each scoring the next
token. Prints one line per policy and writes all figures as JSON.
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import qkindex  # noqa: E402
import qkindex.hf as hf  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--ids", default=str(REPO / "data" / "smollm2-8k-subset" / "prompt_ids.npy"))
    p.add_argument("--context", type=int, default=4096, help="prefill tokens")
    p.add_argument("--decode", type=int, default=128, help="decode steps (tokens scored)")
    p.add_argument("--policies", default="full,static,exact-topk,index-topk")
    p.add_argument("--sink", type=int, default=128)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--ef", type=int, default=None)
    p.add_argument("--no-measure", action="store_true", help="skip recall/mass (faster decode)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=None, help="JSON file to write")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model_path = Path(a.model)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                 dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    ids = np.load(a.ids).astype(np.int64)
    need = a.context + a.decode + 1
    if len(ids) < need:
        raise SystemExit(f"{a.ids}: {len(ids)} ids, need context + decode + 1 = {need}")
    ids = torch.from_numpy(ids[:need])
    results = []
    for policy in a.policies.split(","):
        ra = None if policy == "full" else hf.RetrievalAttention(
            model, policy, sink=a.sink, window=a.window, k=a.k, ef=a.ef,
            measure=not a.no_measure)
        r = hf.perplexity(model, ids, prefill=a.context, attention=ra)
        r["policy"] = policy
        if ra is not None:
            r.update({f"stats_{k}": v for k, v in ra.stats().items() if k != "policy"})
        results.append(r)
        extra = ""
        if ra is not None:
            s = ra.stats()
            extra = (f"  recall {s['recall']:.4f}  mass {s['mass']:.4f}  mass_ratio "
                     f"{s['mass_ratio']:.4f}  keys scored {s['keys_scored']:.0f}  attended "
                     f"{s['keys_attended']:.0f}  build {s['build_s']:.1f}s  search {s['search_s']:.1f}s")
        print(f"{policy:>11}: ppl {r['ppl']:.4f}  prefill {r['prefill_s']:.1f}s  decode "
              f"{r['tokens_per_s']:.2f} tok/s{extra}", flush=True)
    full = next((r for r in results if r["policy"] == "full"), None)
    exact = next((r for r in results if r["policy"] == "exact-topk"), None)
    for r in results:
        if full:
            r["ppl_vs_full"] = r["ppl"] / full["ppl"]
            r["speed_vs_full"] = r["tokens_per_s"] / full["tokens_per_s"]
        if exact:
            r["ppl_vs_exact_topk"] = r["ppl"] / exact["ppl"]
    out = {
        "model": model_path.name, "ids": os.path.relpath(a.ids, REPO), "context": a.context,
        "decode": a.decode, "sink": a.sink, "window": a.window, "k": a.k, "ef": a.ef,
        "measure": not a.no_measure, "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "qkindex": qkindex.__version__,
        "torch_threads": torch.get_num_threads(), "load_s": load_s,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
                   f"{os.getloadavg()[0]:.1f} at the end",
        "results": results,
    }
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
