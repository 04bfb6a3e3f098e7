#!/usr/bin/env python3
"""Where a decode step's time goes, beside the floor each part has on this machine: the bytes
the part must read per step, divided by the measured memory bandwidth.

    python3 scripts/step_floor.py --gguf models/gemma-3-270m-q4_k_m.gguf \
        --eval docs/bench/long/runs/eval-131072-default.json --bandwidth-gibs 12.98

--bandwidth-gibs is the read bandwidth of both cores, as `cargo bench -p qkindex-model --bench
matvec` measures it (`memory_read`: a streaming sum over 256 MiB; or pass --criterion with that
bench's estimates.json). Bytes per step, for the mean context of the decode (context +
continuation / 2):

  matmul            every weight matrix the step multiplies, in its GGUF blocks (the input
                    embedding only where the output head is tied to it)
  attention_global  full: the K and V cache rows of the global layers (f32 or f16 cache, as the
                    run says); a retrieval policy: the keys it attended per selection (K and V, f32)
  attention_local   the sliding-window layers' K and V rows (the window, or the context if shorter)
  search            the stored keys (f16 or f32, as the index's store says; exact-topk scans f32)
                    of every inner product
                    the searches computed; the graph's adjacency is not counted (a lower bound)

Selections per step = the global layers' query heads. Needs the `gguf` package (pip install gguf).
"""
import argparse
import json
import sys


def meta(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if v.dtype.kind == "u" and v.dtype.itemsize == 1 and len(v) > 1 else v[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--eval", required=True, help="qkindex eval --json output")
    bw = ap.add_mutually_exclusive_group(required=True)
    bw.add_argument("--bandwidth-gibs", type=float)
    bw.add_argument("--criterion", help="estimates.json of matvec_256mib/memory_read")
    ap.add_argument("--global-every", type=int, default=None,
                    help="every N-th layer is global (Gemma 3: 6, the default for gemma3 files; "
                         "other architectures: every layer)")
    args = ap.parse_args()
    try:
        import gguf
    except ImportError:
        print("error: needs the gguf package (pip install gguf)", file=sys.stderr)
        return 2
    if args.criterion:
        est = json.load(open(args.criterion))
        ns = est["median"]["point_estimate"]
        bandwidth = (256 << 20) / (ns * 1e-9)
    else:
        bandwidth = args.bandwidth_gibs * (1 << 30)

    r = gguf.GGUFReader(args.gguf)
    arch = meta(r, "general.architecture")
    layers = int(meta(r, f"{arch}.block_count"))
    n_heads = int(meta(r, f"{arch}.attention.head_count"))
    n_kv = int(meta(r, f"{arch}.attention.head_count_kv"))
    emb = int(meta(r, f"{arch}.embedding_length"))
    hd = int(meta(r, f"{arch}.attention.key_length", emb // n_heads))
    window = meta(r, f"{arch}.attention.sliding_window")
    every = args.global_every or (6 if arch == "gemma3" else 1)
    n_global = sum(1 for i in range(layers) if (i + 1) % every == 0)
    n_local = layers - n_global
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    weights = sum(int(t.n_bytes) for t in r.tensors
                  if len(t.shape) == 2 and (tied or t.name != "token_embd.weight"))

    runs = json.load(open(args.eval))
    print(f"{arch}: {layers} layers ({n_global} global, {n_local} local, window {window}), "
          f"{n_heads} query heads over {n_kv} KV heads of {hd}; weights read per step "
          f"{weights / 1e6:.1f} MB; bandwidth {bandwidth / (1 << 30):.2f} GiB/s")
    print()
    print("| policy | part | measured ms | MB per step | floor ms | measured / floor |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        lat = run["latency_ms"]
        n = run["context"] + run["continuation"] / 2
        elem = 2 if run.get("kv_cache") == "f16" else 4
        sel = n_global * n_heads
        local_rows = min(window or n, n) if n_local else 0
        parts = {"matmul": weights,
                 "attention_local": n_local * local_rows * n_kv * hd * 2 * elem}
        if run["policy"] == "full":
            parts["attention_global"] = n_global * n * n_kv * hd * 2 * elem
        else:
            # The index's key copy (`exact-topk` always scans f32).
            f16 = run["config"].get("store") == "float16" and run["policy"] != "exact-topk"
            store = 2 if f16 else 4
            parts["attention_global"] = (run.get("keys_attended") or 0) * sel * hd * 2 * 4
            parts["search"] = (run.get("distance_computations") or 0) * sel * hd * store
        total_b, total_floor = 0.0, 0.0
        for part, b in parts.items():
            floor = b / bandwidth * 1e3
            ms = lat[part]
            total_b += b
            total_floor += floor
            print(f"| {run['policy']} | {part} | {ms:.2f} | {b / 1e6:.1f} | {floor:.2f} | "
                  f"{ms / floor:.2f}× |")
        print(f"| {run['policy']} | **step** (total; parts above plus the rest) | {lat['total']:.2f} | "
              f"{total_b / 1e6:.1f} | {total_floor:.2f} | {lat['total'] / total_floor:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
