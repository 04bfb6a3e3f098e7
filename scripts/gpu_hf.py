"""qkindex.hf on a GPU (issue 46): a random-weight Llama-3.2-1B-shaped model built from a
``LlamaConfig`` (no download: 16 layers, 32 query / 8 KV heads, head_dim 64, hidden 2048,
vocabulary 128,256), bf16 on the device, greedy decoding of ``--new`` tokens after prompts of
``--lengths`` random tokens, under each policy:

- ``sdpa``: the model's own attention (transformers' sdpa, a ``DynamicCache``);
- ``exact-topk``: ``RetrievalAttention`` (sinks 128, window 512, k 100; the scan on the device);
- ``index-topk``: the same with the index (keys to host memory once, builds in background);
- ``index-topk+offload``: the rest's keys and values in host memory only (merge on the host);
- ``index-topk+offload-gather`` (``--gather``): the chosen rows copied to the device instead;
- correctness: ``exact-topk`` with ``k`` ≥ the context (every key selected) must generate
  sdpa's tokens; where a token differs, the step, the logit gap of sdpa's top two there and the
  largest logit difference before it are recorded (bf16 near-ties).

Per policy and length: prefill seconds, the seconds the first decode step would wait for index
builds (``ready_s``) and their summed CPU seconds (``build_s``), ms per token (median of the
decode steps, each synchronised), the KV's device memory (``kv_device_bytes``: the cache's own
tensors, ``kv_held_bytes``: ``torch.cuda.memory_allocated`` after the run minus before the
prefill, ``peak_bytes``: ``max_memory_allocated`` minus that base, the prefill's activations
included), host bytes, and the ratios to sdpa. Writes JSON naming the device.

    python scripts/gpu_hf.py --device cuda --out docs/gpu/                      # hf-nvidia-h200.json
    python scripts/gpu_hf.py --device cpu --small --out /tmp/hf-small.json      # CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import qkindex
import qkindex.hf as hf

FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
            rope_theta=500000.0, tie_word_embeddings=True)
# The builds of this check: causal lists over the decode default's other keys switched off, and
# a smaller graph (kq 50, degree 24, build_ef 100). On 2 shared cores at 131,072 Gaussian keys
# and 4,096 training queries one build took 3.0 s against the decode default's 13.2 s; this
# check builds 128 per index-topk run, so the default would not fit gpu-all.sh's minutes.
LIGHT_BUILD = {"causal": True, "queries_per_key": 0.0, "global_full": 0.0, "far_check": 0.0,
               "auto_ef": 0.0, "kq": 50, "max_degree": 24, "build_ef": 100}
SMALL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=2, head_dim=32, vocab_size=1024,
             rope_theta=10000.0, tie_word_embeddings=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def build_model(small: bool, device: torch.device, dtype: torch.dtype, max_len: int):
    cfg = LlamaConfig(**(SMALL if small else FULL), max_position_embeddings=max_len,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


@torch.no_grad()
def run(model, ids, policy: str, args, device) -> dict:
    """Prefill + ``args.new`` greedy steps under ``policy``; timings, memory, tokens, logits."""
    kw = hf.cache_kwarg(model)
    ra = None
    if policy != "sdpa":
        name, _, mode = policy.partition("+")
        k = ids.shape[1] if name == "exact-topk-all" else args.k
        offload = {"": False, "offload": "merge", "offload-gather": "gather"}[mode]
        ra = hf.RetrievalAttention(model, name.replace("-all", ""), sink=args.sink,
                                   window=args.window, k=k, measure=False, offload=offload,
                                   threads=args.threads, build=args.build,
                                   max_train=args.max_train)
    cache = ra.cache() if ra is not None else DynamicCache(config=model.config)
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base = allocated(device)
    ctx = ra if ra is not None else _Null()
    tokens, logits, steps_ms = [], [], []
    with ctx:
        hf.TRANSFERS.reset()
        t0 = time.perf_counter()
        out = model(input_ids=ids, **{kw: cache}, use_cache=True, logits_to_keep=1)
        sync(device)
        prefill_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if ra is not None:
            for layer in ra.layers:
                ra.indexes(layer.layer_idx)
        ready_s = time.perf_counter() - t1
        prefill_transfers = hf.TRANSFERS.snapshot()
        hf.TRANSFERS.reset()
        last = out.logits[0, -1].float()
        for step in range(args.new):
            tok = int(last.argmax())
            tokens.append(tok)
            logits.append(last.cpu())
            if step == args.new - 1:
                break
            t = time.perf_counter()
            out = model(input_ids=torch.tensor([[tok]], device=device), **{kw: cache},
                        use_cache=True)
            last = out.logits[0, -1].float()
            sync(device)
            steps_ms.append(1000 * (time.perf_counter() - t))
    held = allocated(device) - base
    peak = (torch.cuda.max_memory_allocated(device) - base) if device.type == "cuda" else 0
    kv = cache.kv_bytes() if isinstance(cache, hf.RetrievalCache) else {
        "model": sum(t.numel() * t.element_size() for layer in cache.layers
                     for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)),
        "host": 0}
    decode_transfers = hf.TRANSFERS.snapshot()
    st = ra.stats() if ra is not None else {}
    row = {
        "policy": policy, "context": ids.shape[1], "new_tokens": args.new,
        "prefill_s": prefill_s, "ready_s": ready_s, "build_s": st.get("build_s", 0.0),
        "ms_per_token": statistics.median(steps_ms) if steps_ms else None,
        "ms_per_token_steps": steps_ms,
        "kv_device_bytes": kv["model"], "kv_host_bytes": kv["host"],
        "kv_held_bytes": held, "peak_bytes": peak,
        "transfers_prefill": prefill_transfers,
        "transfers_decode_per_step": {k2: v / max(len(steps_ms), 1)
                                      for k2, v in decode_transfers.items() if k2 != "largest"},
        "transfers_decode_largest": decode_transfers["largest"],
        "tokens": tokens,
    }
    del cache, out
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row, torch.stack(logits)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def compare(ref: dict, ref_logits, got: dict, got_logits) -> dict:
    """Whether ``got`` generated ``ref``'s tokens; else where not, and how close a tie it was."""
    same = ref["tokens"] == got["tokens"]
    first = next((i for i, (a, b) in enumerate(zip(ref["tokens"], got["tokens"])) if a != b), None)
    upto = len(ref["tokens"]) if first is None else first + 1
    diff = float((ref_logits[:upto] - got_logits[:upto]).abs().max())
    res = {"tokens_equal": same, "max_logit_diff": diff}
    if first is not None:
        top2 = ref_logits[first].topk(2).values
        res.update(first_difference=first, sdpa_top2_gap=float(top2[0] - top2[1]))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true",
                    help="a tiny config and prompts of 600 and 1,200 tokens (CPU check)")
    ap.add_argument("--lengths", default=None, help="prompt lengths (default 32768,131072)")
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--sink", type=int, default=128)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gather", action="store_true", help="also index-topk+offload-gather")
    ap.add_argument("--build", type=json.loads, default=dict(LIGHT_BUILD),
                    help="AttentionIndex.build keywords (JSON) over the decode default; default "
                         f"{json.dumps(LIGHT_BUILD)}")
    ap.add_argument("--max-train", type=int, default=4096)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds: runs that would start later are skipped (and reported)")
    ap.add_argument("--out", required=True,
                    help="a .json file, or a directory for hf-<device name>.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.small:
        args.sink, args.window, args.k = min(args.sink, 16), min(args.window, 64), min(args.k, 32)
    lengths = [int(x) for x in (args.lengths or ("600,1200" if args.small else "32768,131072"))
               .split(",")]
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    model = build_model(args.small, device, dtype, max(lengths) + args.new + 8)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    report = {
        "device": str(device), "device_name": name,
        "model": "random-weight LlamaForCausalLM, " + ("small config" if args.small else
                                                       "Llama-3.2-1B shape"),
        "config": SMALL if args.small else FULL, "dtype": args.dtype,
        "sink": args.sink, "window": args.window, "k": args.k, "new_tokens": args.new,
        "build": args.build, "max_train": args.max_train,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "qkindex": qkindex.__version__, "cpus": os.cpu_count(),
        "knn_device": qkindex.knn_device("auto"),
        "model_build_s": time.perf_counter() - t0, "runs": [], "checks": [],
    }
    # The correctness check and offload early: if --time-limit cuts a length short, what the
    # issue asks first has run.
    policies = ["sdpa", "exact-topk-all", "exact-topk", "index-topk+offload", "index-topk"]
    if args.gather:
        policies.append("index-topk+offload-gather")
    failures = []
    g = torch.Generator().manual_seed(1)
    for n in lengths:
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g).to(device)
        rows = {}
        for policy in policies:
            t = time.perf_counter()
            if args.time_limit is not None and t - t0 > args.time_limit:
                failures.append(f"{policy} at {n}: skipped, past --time-limit {args.time_limit} s")
                print("SKIPPED:", failures[-1], flush=True)
                continue
            try:
                row, logits = run(model, ids, policy, args, device)
            except Exception as e:  # a failed policy is reported, the others still run
                failures.append(f"{policy} at {n}: {type(e).__name__}: {e}")
                print("FAILED:", failures[-1], flush=True)
                continue
            row["wall_s"] = time.perf_counter() - t
            rows[policy] = (row, logits)
            if policy != "exact-topk-all":
                report["runs"].append(row)
            print(f"{n:>7} {policy:<26} prefill {row['prefill_s']:7.2f} s, ready "
                  f"{row['ready_s']:6.2f} s, {row['ms_per_token'] or 0:8.1f} ms/token, KV on "
                  f"device {row['kv_device_bytes'] / 2**20:9.1f} MiB (held "
                  f"{row['kv_held_bytes'] / 2**20:9.1f}), host {row['kv_host_bytes'] / 2**20:9.1f}"
                  f" MiB, {row['wall_s']:.1f} s", flush=True)
        if "sdpa" in rows:
            sd = rows["sdpa"][0]
            for row, _ in rows.values():
                if row["policy"] == "sdpa" or row["ms_per_token"] is None:
                    continue
                row["ms_per_token_vs_sdpa"] = row["ms_per_token"] / sd["ms_per_token"]
                row["kv_device_vs_sdpa"] = row["kv_device_bytes"] / max(sd["kv_device_bytes"], 1)
                row["kv_held_vs_sdpa"] = row["kv_held_bytes"] / max(sd["kv_held_bytes"], 1)
            if "exact-topk-all" in rows:
                check = {"context": n, "check": "exact-topk with k >= context generates sdpa's "
                         "tokens", **compare(sd, rows["sdpa"][1], *rows["exact-topk-all"])}
                report["checks"].append(check)
                print(f"{n:>7} check: {check}", flush=True)
    report["failures"] = failures
    report["total_s"] = time.perf_counter() - t0
    out = Path(args.out)
    if out.suffix != ".json":
        slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
        out = out / f"hf-{slug or device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out} in {report['total_s']:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
