"""faiss peers (IVF-Flat, IVF-PQ fast-scan with and without an exact refine) on a dump's heads:
q2k recall@100 against the exact f32 top-100 and single-thread QPS (one batch call of all decode
queries, median of 3). Prints one JSON row per (head, variant, params)."""
import json, sys, time
import numpy as np
import faiss

faiss.omp_set_num_threads(1)
d_dir = sys.argv[1]
m = json.load(open(f"{d_dir}/manifest.json"))
g = m["n_q_heads"] // m["n_kv_heads"]
layers = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else m["layers"]
heads = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else range(m["n_q_heads"])
K = 100
IP = faiss.METRIC_INNER_PRODUCT

def recall(found, exact):
    return float(np.mean([len(set(f) & set(e)) / K for f, e in zip(found, exact)]))

def timed(index, q):
    ts = []
    for _ in range(3):
        t = time.thread_time(); _, ids = index.search(q, K); ts.append(time.thread_time() - t)
    return ids, len(q) / sorted(ts)[1]

for L in layers:
    k_all = np.load(f"{d_dir}/layer{L:02d}.k.npy").astype(np.float32)
    q_all = np.load(f"{d_dir}/layer{L:02d}.qdec.npy").astype(np.float32)
    for h in heads:
        keys = np.ascontiguousarray(k_all[h // g]); q = np.ascontiguousarray(q_all[h])
        n, d = keys.shape
        exact = np.argsort(-(q @ keys.T), axis=1)[:, :K]
        nlist = int(round(4 * np.sqrt(n)))
        flat = faiss.IndexFlatIP(d); flat.add(keys)
        _, fqps = timed(flat, q)
        print(json.dumps({"layer": L, "head": h, "index": "flat", "params": {}, "recall": 1.0, "qps": fqps, "bytes_per_key": 4 * d}), flush=True)
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, IP); ivf.train(keys); ivf.add(keys)
        for nprobe in (4, 8, 12, 16, 24, 32, 48, 64, 96, 128):
            ivf.nprobe = nprobe
            ids, qps = timed(ivf, q)
            print(json.dumps({"layer": L, "head": h, "index": "ivf-flat", "params": {"nprobe": nprobe}, "recall": recall(ids, exact), "qps": qps, "bytes_per_key": 4 * d + 8}), flush=True)
        msub = d // 2 if d <= 64 else d // 4
        pq = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(d), d, nlist, msub, 4, IP); pq.train(keys); pq.add(keys)
        for refine in (0, 2, 4):
            index = pq
            if refine:
                index = faiss.IndexRefineFlat(pq, faiss.swig_ptr(keys)); index.k_factor = refine
            for nprobe in (4, 8, 16, 32, 64, 128):
                pq.nprobe = nprobe
                ids, qps = timed(index, q)
                print(json.dumps({"layer": L, "head": h, "index": "ivf-pq-fastscan", "params": {"nprobe": nprobe, "refine": refine, "m": msub}, "recall": recall(ids, exact), "qps": qps, "bytes_per_key": msub / 2 + 8 + (4 * d if refine else 0)}), flush=True)
