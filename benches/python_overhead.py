"""Python-layer overhead of qkindex search, and batched search against threads.

1. Single query, k = 100: per-call latency of `index.search(q)` from Python (perf_counter_ns
   around each call) against the same search timed inside Rust (`qkindex._native.
   _search_latency_ns`: the loop runs in Rust with a reused scratch). The difference of the
   medians is what the Python layer adds (argument checks, GIL release, result arrays).
2. One batched call of all decode queries (64) with rayon's pool at 1 and 2 threads (each in a
   child process with RAYON_NUM_THREADS set, since the pool is sized once per process).

    python benches/python_overhead.py [DUMP] [--layer 9] [--head 0] [--ef 128] [--out FILE.json]

Timing is wall-clock: run it on an idle machine for figures to quote.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import qkindex

REPO = Path(__file__).resolve().parents[1]


def load(args):
    dump = qkindex.load_dump(args.dump)
    m = dump.manifest
    kv = dump.kv_head_of(args.head)
    group = m["n_q_heads"] // m["n_kv_heads"]
    q = dump.q(args.layer)
    keys = dump.k(args.layer)[kv].astype(np.float16)
    others = [h for h in range(kv * group, (kv + 1) * group) if h != args.head]
    train = np.concatenate([q[h] for h in others] + [q[args.head]])
    queries = np.ascontiguousarray(dump.qdec(args.layer)[args.head])
    return keys, train, queries


def single(index, queries, k, ef, rounds):
    """The same call sequence (rounds × the queries in order) timed per call from Python and
    inside Rust, interleaved round by round so that load changes hit both alike."""
    py, rust = [], []
    for q in queries:  # warm-up
        index.search(q, k=k, ef=ef)
    for _ in range(rounds):
        for q in queries:
            t = time.perf_counter_ns()
            index.search(q, k=k, ef=ef)
            py.append(time.perf_counter_ns() - t)
        rust.extend(qkindex._native._search_latency_ns(index, queries, k=k, ef=ef, rounds=1))
    return statistics.median(py) / 1e3, statistics.median(rust) / 1e3


def batched(args):
    keys, train, queries = load(args)
    index = qkindex.AttentionIndex.build(keys, train)
    index.search(queries, k=args.k, ef=args.ef)
    times = []
    for _ in range(args.rounds):
        t = time.perf_counter_ns()
        index.search(queries, k=args.k, ef=args.ef)
        times.append(time.perf_counter_ns() - t)
    ms = statistics.median(times) / 1e6
    print(json.dumps({"threads": os.environ.get("RAYON_NUM_THREADS"), "batch": len(queries),
                      "median_ms": ms, "qps": len(queries) / (ms / 1e3)}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dump", nargs="?", default=str(REPO / "data" / "smollm2-8k-subset"))
    p.add_argument("--layer", type=int, default=9)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--ef", type=int, default=128)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--out", default=None)
    p.add_argument("--batched-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.batched_child:
        return batched(args)

    keys, train, queries = load(args)
    index = qkindex.AttentionIndex.build(keys, train)
    py_us, rust_us = single(index, queries, args.k, args.ef, args.rounds)
    report = {
        "dump": args.dump, "layer": args.layer, "head": args.head, "k": args.k, "ef": args.ef,
        "n": len(keys), "queries": len(queries), "rounds": args.rounds,
        "single": {"python_median_us": py_us, "rust_median_us": rust_us,
                   "overhead_us": py_us - rust_us},
        "batched": [],
        "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
    }
    for threads in (1, 2):
        env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
        cmd = [sys.executable, __file__, args.dump, "--layer", str(args.layer), "--head",
               str(args.head), "--k", str(args.k), "--ef", str(args.ef), "--rounds",
               str(args.rounds), "--batched-child"]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        report["batched"].append(json.loads(out.strip().splitlines()[-1]))
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
