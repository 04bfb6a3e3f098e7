"""PyTorch reference for the driver's GPU check: scaled-dot-product attention at SmolLM2's shapes
(9 query heads, 3 KV heads, head dim 64, f32 like our kernels), causal prefill over `n` tokens and
one decode query over `n` keys, timed with CUDA events (median of the timed runs after a warm-up)."""

import argparse
import json

import torch
import torch.nn.functional as F


def timed(fn, reps):
    times = []
    for rep in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if rep > 0:
            times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8128)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = a.heads // a.kv_heads
    q = torch.randn(1, a.heads, a.n, a.head_dim, device=dev)
    k = torch.randn(1, a.kv_heads, a.n, a.head_dim, device=dev)
    v = torch.randn(1, a.kv_heads, a.n, a.head_dim, device=dev)
    # GQA by repeating the KV heads (works on every PyTorch 2.x).
    kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    res = {"n": a.n, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "dtype": "float32"}
    res["prefill_causal_ms"] = timed(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True), a.reps)
    q1 = q[:, :, -1:, :].contiguous()
    res["decode_one_query_ms"] = timed(lambda: F.scaled_dot_product_attention(q1, kr, vr), a.reps)
    res["prefill_causal_ms_f16"] = timed(
        lambda: F.scaled_dot_product_attention(q.half(), kr.half(), vr.half(), is_causal=True), a.reps)
    res["torch"] = torch.__version__
    res["device"] = torch.cuda.get_device_name(0)
    json.dump(res, open(a.out, "w"), indent=2)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
