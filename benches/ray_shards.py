"""One head sharded by position over Ray actors (qkindex.distributed, issue 48): build time,
per-query latency, recall@100 at a fixed ef, and the fan-out and merge cost, in 1, 2 and 4
shards, against the same index kind unsharded in this process.

    python3 /path/to/synth_ood.py --out bench-out/synth1m --N 1048576 --d 128 --no-diag
    python benches/ray_shards.py bench-out/synth1m --spec flat --shards 1,2,4 --batch 1,32
    python benches/ray_shards.py bench-out/synth1m --spec attention --train 16384 --ef 128 \\
        --single-ef 256,512 --shards 1,2,4 --batch 1,32 --out bench-out/ray/attention-1m.json

DATA is a ``synth_ood.py`` output directory (``keys.npy``, ``prefill_queries.npy``,
``test_queries.npy``, float16). ``--n`` takes the first n keys (positions 0..n), ``--train`` an
evenly spaced subset of the prefill queries as the training queries (index kinds that use them).

Ray runs locally (one node, the shards its actors, one logical CPU each); queries are sent one
per call, as a decode step of one head would send them, and with ``--batch 1,32`` also 32 per
call. Per call: ``call`` is the wall time of ``ShardedIndex.search`` (validation, ray.put,
fan-out, waiting, merge); ``shard`` the slowest shard's own search time inside its actor;
``merge`` the client's merge; ``fan-out`` = call - shard - merge (Ray's submission, scheduling,
transfer of the results). Medians over the calls, after the calls holding the first ``--warmup``
queries. ``scanned`` = distance computations per query, summed over the shards, / n. Recall@k is
against the exact top-k over all n keys, over every query. The index is built with the spec's
defaults, and every shard is searched with the same ``--ef``.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import qkindex


def median_ms(xs):
    return statistics.median(xs) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="synth_ood.py output directory")
    ap.add_argument("--spec", default="flat", help="index spec of every shard (qkindex.build)")
    ap.add_argument("--n", type=int, default=None, help="first n keys (default: all)")
    ap.add_argument("--train", type=int, default=8192, help="training queries (kinds using them)")
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--ef", type=int, default=None, help="search ef (graph kinds)")
    ap.add_argument("--single-ef", default="",
                    help="more ef values for the unsharded index (one query per call), to "
                         "compare recall at the work S shards do at --ef")
    ap.add_argument("--queries", type=int, default=256, help="test queries timed")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--batch", default="1", help="queries per search call (a list: 1,32)")
    ap.add_argument("--cpus", type=int, default=4, help="Ray's logical CPUs (one per actor)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()

    import ray

    import qkindex.distributed as qd

    data = Path(args.data)
    keys = np.load(data / "keys.npy", mmap_mode="r")
    n = keys.shape[0] if args.n is None else args.n
    keys = np.ascontiguousarray(keys[:n])
    queries = np.ascontiguousarray(np.load(data / "test_queries.npy")[: args.queries])
    needs_train = args.spec.split(":")[0] in ("attention", "robust-vamana")
    train = None
    if needs_train:
        pq = np.load(data / "prefill_queries.npy", mmap_mode="r")
        pick = np.linspace(0, n - 1, min(args.train, n)).round().astype(int)
        train = np.ascontiguousarray(pq[pick])
    params = {} if args.ef is None else {"ef": args.ef}
    t = time.perf_counter()
    exact, _ = qkindex.exact_topk(queries, keys, args.k, device="cpu")
    print(f"exact top-{args.k} of {len(queries)} queries over {n} keys: "
          f"{time.perf_counter() - t:.1f} s", file=sys.stderr)

    batches = [int(x) for x in args.batch.split(",")]

    def measure(search, shards, build_s, row_params=None, batch_sizes=None):
        """One row per batch size: medians per call, recall and scanned over all queries."""
        for batch in batch_sizes or batches:
            lat, shard, merge, fan = [], [], [], []
            found, dc = [], []
            for i in range(0, len(queries), batch):
                q = queries[i:i + batch]
                t = time.perf_counter()
                res = search(q)
                wall = time.perf_counter() - t
                found.append(res.ids)
                dc.append(res.distance_computations)
                if i < args.warmup:
                    continue
                tm = getattr(res, "timing", None)
                if tm is None:
                    lat.append(wall)
                else:
                    lat.append(tm["total"])
                    shard.append(max(tm["shards"]))
                    merge.append(tm["merge"])
                    fan.append(tm["total"] - max(tm["shards"]) - tm["merge"])
            row = {"shards": shards, "batch": batch, "build_s": build_s,
                   "params": row_params if row_params is not None else params,
                   "call_ms": median_ms(lat),
                   "shard_ms": median_ms(shard) if shard else None,
                   "fanout_ms": median_ms(fan) if fan else None,
                   "merge_ms": median_ms(merge) if merge else None,
                   "scanned": float(np.concatenate(dc).mean() / n),
                   "recall": qkindex.recall(np.concatenate(found), exact)}
            rows.append(row)
            print(row, file=sys.stderr, flush=True)

    rows = []
    # Unsharded, in this process: the reference for recall and latency.
    t = time.perf_counter()
    single = qkindex.build(args.spec, keys, train)
    build_s = time.perf_counter() - t
    measure(lambda q: single.search(q, k=args.k, **params), 0, build_s)
    for ef in [int(x) for x in args.single_ef.split(",") if x]:
        measure(lambda q: single.search(q, k=args.k, ef=ef), 0, build_s, {"ef": ef}, [1])
    del single

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    for s in [int(x) for x in args.shards.split(",")]:
        t = time.perf_counter()
        idx = qd.ShardedIndex.build(args.spec, keys, train, shards=s,
                                    actor_options={"num_cpus": 1})
        measure(lambda q: idx.search(q, k=args.k, **params), s, time.perf_counter() - t)
        idx.close()
    ray.shutdown()

    meta = {"spec": args.spec, "n": n, "d": int(keys.shape[1]), "k": args.k,
            "params": params, "train": None if train is None else len(train),
            "queries": len(queries), "warmup": args.warmup, "cpus_os": os.cpu_count(),
            "machine": platform.processor() or platform.machine(),
            "command": "python " + " ".join(sys.argv)}
    print(f"\n{args.spec}, n={n}, d={keys.shape[1]}, k={args.k}, {params or 'no params'}, "
          f"train {meta['train']}, {len(queries)} queries (medians per call, ms)")
    print("| shards | params | queries/call | build s | call ms | slowest shard ms | fan-out ms "
          "| merge ms | scanned | recall@%d |" % args.k)
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = (lambda x: "-" if x is None else f"{x:.2f}")
        name = "unsharded (no Ray)" if r["shards"] == 0 else str(r["shards"])
        ps = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-"
        print(f"| {name} | {ps} | {r['batch']} | {r['build_s']:.1f} | {r['call_ms']:.2f} | "
              f"{f(r['shard_ms'])} | {f(r['fanout_ms'])} | {f(r['merge_ms'])} | "
              f"{r['scanned']:.4f} | {r['recall']:.4f} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
