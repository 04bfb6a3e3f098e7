"""PyTorch reference for the GPU kNN check: exact top-k by inner product, chunked over queries
(`torch.topk(q @ k.T, k)` with f16 inputs), timed with CUDA events on the same GPU and data shape
as `qkindex-gpu-check run`. Writes JSON with the median of the timed runs (after one warm-up)."""

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=131072, help="queries = keys")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--chunk", type=int, default=8192, help="queries per q @ k.T")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.rand(a.n, a.d, device=dev, generator=g, dtype=torch.float32).mul_(2).sub_(1).half()
    keys = torch.rand(a.n, a.d, device=dev, generator=g, dtype=torch.float32).mul_(2).sub_(1).half()

    def run():
        ids = torch.empty(a.n, a.k, dtype=torch.int64, device=dev)
        for s in range(0, a.n, a.chunk):
            scores = q[s : s + a.chunk] @ keys.T
            ids[s : s + a.chunk] = torch.topk(scores, a.k, dim=1).indices
        return ids

    times = []
    for rep in range(a.reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        if rep > 0:
            times.append(start.elapsed_time(end))
    times.sort()
    res = {"n": a.n, "d": a.d, "k": a.k, "chunk": a.chunk, "dtype": "float16",
           "times_ms": times, "median_ms": times[len(times) // 2],
           "torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    json.dump(res, open(a.out, "w"), indent=2)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
