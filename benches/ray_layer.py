"""A whole layer's heads over Ray shards: one call per shard per layer (``ShardedDump``) against
one call per query head (a ``ShardedIndex`` per KV head), and ``qkindex.search_many`` unsharded
in this process (issue 48).

    python benches/ray_layer.py bench-out/synth1m --n 65536 --kv-heads 2 --q-heads 8 --shards 1,2,4

It writes a dump (``--work``, default ``bench-out/ray-layer``) of one layer with ``--kv-heads``
KV heads, KV head ``h`` being keys ``[h·n, (h+1)·n)`` of the ``synth_ood.py`` output DATA, and
``--q-heads`` query heads whose decode queries are the DATA's test queries (query head ``j``:
every ``q-heads``-th query from ``j``). It builds flat (exact) shards with
``qkindex.distributed.build_dump`` and times decode steps: one query per query head per step,
after ``--warmup`` untimed steps; medians in ms. Every result is checked against the unsharded
``search_many`` (ids equal). The actors take Ray's default resources (one CPU to be placed,
none while they run), so more actors than ``--cpus`` can live at once."""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import qkindex


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--n", type=int, default=65536, help="keys per KV head")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--work", default="bench-out/ray-layer")
    ap.add_argument("--cpus", type=int, default=4)
    args = ap.parse_args()

    import ray

    import qkindex.distributed as qd

    data = Path(args.data)
    keys = np.load(data / "keys.npy", mmap_mode="r")
    test = np.load(data / "test_queries.npy")
    n, hk, hq = args.n, args.kv_heads, args.q_heads
    if hk * n > keys.shape[0] or hq % hk:
        sys.exit(f"need kv_heads * n <= {keys.shape[0]} and q_heads divisible by kv_heads")
    k_all = np.stack([np.asarray(keys[h * n:(h + 1) * n]) for h in range(hk)])
    steps = len(test) // hq
    qdec = np.stack([test[j::hq][:steps] for j in range(hq)])  # [hq, steps, d]
    dump_dir = Path(args.work) / "dump"
    group = hq // hk
    # Prefill queries (a dump has them; flat shards do not use them): query head j takes the
    # DATA's prefill queries of its KV head's positions.
    pq = np.load(data / "prefill_queries.npy", mmap_mode="r")
    q_all = np.stack([np.asarray(pq[(j // group) * n:(j // group + 1) * n]) for j in range(hq)])
    qkindex.write_dump(dump_dir, {"model": "synth_ood.py slices (benches/ray_layer.py)",
                                  "rope_theta": 500000.0},
                       {0: {"q": q_all, "k": k_all, "qdec": qdec}})
    del q_all
    local = [qkindex.FlatIndex.build(k_all[h]) for h in range(hk)]
    per_head = [local[j // group] for j in range(hq)]

    def timed(fn):
        out, lat = [], []
        for t in range(steps):
            q = np.ascontiguousarray(qdec[:, t:t + 1])
            t0 = time.perf_counter()
            out.append(fn(q))
            if t >= args.warmup:
                lat.append(time.perf_counter() - t0)
        return out, statistics.median(lat) * 1e3

    want, unsharded_ms = timed(lambda q: qkindex.search_many(per_head, q, k=args.k).ids)
    rows = [("unsharded `search_many` (no Ray)", "-", 1, unsharded_ms)]
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    for s in [int(x) for x in args.shards.split(",")]:
        out = Path(args.work) / f"flat-s{s}"
        qd.build_dump(dump_dir, "flat", shards=s, out=out, progress=False)
        layer = qd.ShardedDump.open(out)
        got, ms = timed(lambda q: layer.search(0, q, k=args.k).ids)
        assert all((a == b).all() for a, b in zip(got, want)), "ShardedDump differs"
        rows.append(("`ShardedDump.search` (one call per shard)", s, s, ms))
        layer.close()
        heads = [qd.ShardedIndex.open(out, layer=0, kv_head=h) for h in range(hk)]

        def per_call(q):
            return np.stack([heads[j // group].search(q[j], k=args.k).ids for j in range(hq)])

        got, ms = timed(per_call)
        assert all((a == b).all() for a, b in zip(got, want)), "per-head calls differ"
        rows.append(("`ShardedIndex.search` per query head", s, s * hq, ms))
        for h in heads:
            h.close()
    ray.shutdown()
    print(f"\nlayer of {hq} query heads / {hk} KV heads x {n} keys, d={k_all.shape[2]}, flat, "
          f"k={args.k}, one query per head per step, {steps} steps (median ms per step); "
          f"{os.cpu_count()} cores")
    print("| how | shards | Ray calls per step | ms per step |")
    print("|---|---|---|---|")
    for how, s, calls, ms in rows:
        print(f"| {how} | {s} | {calls if s != '-' else 0} | {ms:.2f} |")
    print(f"command: python {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
