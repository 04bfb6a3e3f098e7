#!/usr/bin/env python3
"""Peer benchmark: faiss and hnswlib on a qkindex dump, timed the way `qkindex bench` times.

For every selected (layer, query head) of a dump directory (docs/DESIGN.md section 4) this script

  * takes the keys of the head's KV head (h // (n_q_heads // n_kv_heads)), float16 -> float32,
  * takes the query sets  q2k = the head's decode queries (layerLL.qdec.npy)
                          k2k = its KV head's decode / held-out keys (layerLL.kdec.npy),
  * computes the exact top-k by inner product (float32 numpy matmul + argpartition),
  * builds each peer index once per (layer, KV head) and searches it over a parameter grid,
  * writes rows in the `qkindex-bench/1` schema (docs/DESIGN.md section 4), prints a table and the
    smallest `scanned` / best QPS that reach mean recall@k >= 0.90 / 0.95 / 0.99.

Peer kinds (--kinds):
  faiss-flat   faiss.IndexFlatIP                                    index=flat  variant=""
  faiss-ivf    faiss.IndexIVFFlat(IndexFlatIP quantizer, METRIC_INNER_PRODUCT), nprobe sweep
                                                                    index=ivf   variant=""
  faiss-ivfpq-fs
               faiss.IndexIVFPQFastScan (4-bit PQ codes, M = d/2 sub-quantizers up to d = 64, d/4
               above; IndexFlatIP quantizer, METRIC_INNER_PRODUCT), nprobe sweep, ranked on codes
                                                                    index=ivfpq-fs variant=""
  faiss-ivfpq-fs-refine
               the same wrapped in IndexRefineFlat: the best k_factor·k by code are re-ranked on
               the f32 keys (one peer per --refine value)           index=ivfpq-fs variant="refine×F"
  faiss-hnsw   faiss.IndexHNSWFlat(d, M, METRIC_INNER_PRODUCT), efConstruction, efSearch sweep
                                                                    index=hnsw  variant="ip"
  hnswlib-ip   hnswlib space 'ip', M=16, ef_construction=200, ef sweep
                                                                    index=hnsw  variant="ip"
  hnswlib-l2r  hnswlib space 'l2' on the MIPS->L2 reduction (keys get an extra coordinate
               sqrt(R^2 - |k|^2), R = max key norm; queries get 0); scores reported are the
               original inner products                               index=hnsw  variant="" (as qkindex hnsw: L2-reduced by default)

Timing (single thread everywhere): QPS = n_queries / median over --repeat of the wall time of ONE
batch call per query set and setting (faiss index.search(all queries), hnswlib knn_query(all)).
Latency p50/p99: single-query calls in a Python loop, all queries repeated until at least
--latency-samples calls, in microseconds (includes the Python call overhead of a few us).

distance_computations / scanned: exact for faiss (flat: n; IVF: nlist centroid products + the sizes
of the probed inverted lists, from quantizer.search and invlists.list_size; HNSW: faiss' own counter
hnsw_stats.ndis, upper levels included, from one extra untimed batch call; IVF-PQ fast-scan:
the nlist centroid products plus the k_factor·k re-ranked keys, with the probed list sizes in
code_estimates, as `qkindex bench` reports its code walk). hnswlib does not expose
a counter, so both are null for hnswlib rows (never estimated).

Both HNSW peers take --M and --ef-construction (defaults 16 and 200, the defaults of
`qkindex bench --kinds hnsw:m=16,ef-construction=200`): pass the same values to both programs.

Packages: unless --no-venv is given, the script creates a virtual environment (--venv, default
benches/.venv-peers), installs benches/requirements-peers.txt into it with pip (again only when
that file changes), and re-runs itself with the environment's python.

Summary mode (--summary FILE.json [FILE.json ...]) reads result files and prints, per query set,
for every (impl, index, variant): per head the smallest scanned and the best QPS reaching each
target, and the per-head ratio of that QPS over the faiss-flat QPS of the same head
(median and max over heads).
"""
import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:  # the system python may lack numpy; main() re-runs in the venv first
    np = None

SCHEMA = "qkindex-bench/1"
ALL_KINDS = ["faiss-flat", "faiss-ivf", "faiss-ivfpq-fs", "faiss-ivfpq-fs-refine", "faiss-hnsw",
             "hnswlib-ip", "hnswlib-l2r"]
KIND_META = {  # kind -> (index, variant, impl)
    "faiss-flat": ("flat", "", "faiss"),
    "faiss-ivf": ("ivf", "", "faiss"),
    "faiss-ivfpq-fs": ("ivfpq-fs", "", "faiss"),
    "faiss-ivfpq-fs-refine": ("ivfpq-fs", "refine", "faiss"),
    "faiss-hnsw": ("hnsw", "ip", "faiss"),
    "hnswlib-ip": ("hnsw", "ip", "hnswlib"),
    "hnswlib-l2r": ("hnsw", "", "hnswlib"),
}
DEFAULT_EF = "100,128,160,200,256,320,400,512,640,800,1024"
DEFAULT_NPROBE = "1,2,4,8,16,32,64,128,256"
TARGETS = (0.90, 0.95, 0.99)


def die(msg):
    print("peers.py: error: " + msg, file=sys.stderr)
    sys.exit(2)


def int_list(s):
    try:
        return [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers, got %r" % s)


def str_list(s):
    return [x.strip() for x in s.split(",") if x.strip() != ""]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# ----------------------------------------------------------------------------- dump reading
class Dump:
    """Reads the dump layout of docs/DESIGN.md section 4 (only what the peers need)."""

    def __init__(self, path):
        self.path = path
        mpath = os.path.join(path, "manifest.json")
        if not os.path.isdir(path):
            die("dump directory %s does not exist" % path)
        if not os.path.isfile(mpath):
            die("%s has no manifest.json (not a qkindex dump directory)" % path)
        with open(mpath) as f:
            m = json.load(f)
        for key in ("head_dim", "n_q_heads", "n_kv_heads", "layers"):
            if key not in m:
                die("%s: manifest field %r is missing" % (mpath, key))
        if m["n_q_heads"] % m["n_kv_heads"] != 0:
            die("%s: n_q_heads %d is not a multiple of n_kv_heads %d" % (mpath, m["n_q_heads"], m["n_kv_heads"]))
        self.manifest = m
        self.d = int(m["head_dim"])
        self.n_q_heads = int(m["n_q_heads"])
        self.n_kv_heads = int(m["n_kv_heads"])
        self.group = self.n_q_heads // self.n_kv_heads
        self.layers = [int(x) for x in m["layers"]]

    def kv_head(self, h):
        return h // self.group

    def load(self, layer, what):
        """what in {k, qdec, kdec}; returns the memory-mapped array, checked for shape."""
        fn = os.path.join(self.path, "layer%02d.%s.npy" % (layer, what))
        if not os.path.isfile(fn):
            die("missing file %s (needed for %s)" % (fn, {"k": "keys", "qdec": "q2k queries",
                                                         "kdec": "k2k queries"}[what]))
        a = np.load(fn, mmap_mode="r")
        heads = self.n_kv_heads if what in ("k", "kdec") else self.n_q_heads
        if a.ndim != 3 or a.shape[0] != heads or a.shape[2] != self.d:
            die("%s has shape %s, expected [%d, n, %d]" % (fn, a.shape, heads, self.d))
        if a.dtype not in (np.float16, np.float32):
            die("%s has dtype %s, expected float16 or float32" % (fn, a.dtype))
        return a


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


# ----------------------------------------------------------------------------- ground truth, metrics
def exact_topk(Q, K, k):
    """Exact top-k by inner product (float32 matmul), ids sorted by descending score."""
    S = Q @ K.T
    part = np.argpartition(-S, k - 1, axis=1)[:, :k]
    ps = np.take_along_axis(S, part, axis=1)
    order = np.argsort(-ps, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1).astype(np.int64), S


def recall_at_k(found, exact, k):
    tot = 0.0
    for f, e in zip(found, exact):
        f = f[f >= 0]
        tot += np.intersect1d(f, e, assume_unique=False).size / k
    return tot / len(exact)


class Mass:
    """Softmax attention mass (scale 1/sqrt(d), over all keys) of a set of key ids, per query."""

    def __init__(self, S, d, exact_ids):
        L = S.astype(np.float64) / math.sqrt(d)
        mx = L.max(axis=1, keepdims=True)
        self.logp = L - (mx + np.log(np.exp(L - mx).sum(axis=1, keepdims=True)))
        self.exact_mass = self.mass(exact_ids)

    def mass(self, ids):
        out = np.empty(len(ids))
        for i, row in enumerate(ids):
            row = np.unique(row[row >= 0])
            out[i] = np.exp(self.logp[i, row]).sum()
        return out

    def ratio(self, ids):
        return float(np.mean(self.mass(ids) / self.exact_mass))


# ----------------------------------------------------------------------------- peers
class Peer:
    """Common interface: build(keys), configure(param), search(Q, k) -> ids, dcs(Q, k) -> per-query counts or None."""
    param_name = None

    def params(self, args):
        return [None]


class FaissFlat(Peer):
    def __init__(self, args):
        import faiss
        self.faiss = faiss

    def build(self, K):
        self.n = K.shape[0]
        self.index = self.faiss.IndexFlatIP(K.shape[1])
        self.index.add(K)

    def configure(self, p):
        pass

    def search(self, Q, k):
        return self.index.search(Q, k)[1]

    def dcs(self, Q, k):
        return np.full(len(Q), float(self.n))


class FaissIVF(Peer):
    param_name = "nprobe"

    def __init__(self, args, nlist=None):
        import faiss
        self.faiss = faiss
        self.args = args
        self.nlist_req = nlist

    def build(self, K):
        n, d = K.shape
        self.n = n
        nlist = self.nlist_req if self.nlist_req else max(1, int(round(4 * math.sqrt(n))))
        nlist = min(nlist, n)
        self.nlist = nlist
        quant = self.faiss.IndexFlatIP(d)
        ivf = self.faiss.IndexIVFFlat(quant, d, nlist, self.faiss.METRIC_INNER_PRODUCT)
        ivf.cp.niter = self.args.ivf_iters
        ivf.cp.seed = self.args.seed
        ivf.train(K)
        ivf.add(K)
        self.quant = quant  # keep the python object alive
        self.index = ivf
        inv = ivf.invlists
        self.sizes = np.array([inv.list_size(i) for i in range(nlist)], dtype=np.int64)

    def params(self, args):
        return [p for p in args.nprobe if p <= self.nlist] or [self.nlist]

    def configure(self, p):
        self.index.nprobe = p

    def search(self, Q, k):
        return self.index.search(Q, k)[1]

    def dcs(self, Q, k):
        _, lists = self.index.quantizer.search(Q, self.index.nprobe)
        probed = np.where(lists >= 0, self.sizes[np.maximum(lists, 0)], 0)
        return self.nlist + probed.sum(axis=1).astype(np.float64)


class FaissIVFPQFastScan(FaissIVF):
    """faiss IndexIVFPQFastScan with 4-bit codes, optionally behind an exact IndexRefineFlat."""

    def __init__(self, args, refine=None):
        super().__init__(args, args.nlist[0] if args.nlist else None)
        self.refine = refine
        self.variant = "" if refine is None else "refine×%d" % refine

    def build(self, K):
        faiss = self.faiss
        n, d = K.shape
        self.n = n
        nlist = min(self.nlist_req or max(1, int(round(4 * math.sqrt(n)))), n)
        self.nlist = nlist
        m = d // 2 if d <= 64 else d // 4
        quant = faiss.IndexFlatIP(d)
        ivf = faiss.IndexIVFPQFastScan(quant, d, nlist, m, 4, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.niter = self.args.ivf_iters
        ivf.cp.seed = self.args.seed
        ivf.train(K)
        self.quant, self.ivf = quant, ivf  # keep the python objects alive
        self.m = m
        if self.refine is None:
            self.index = ivf
        else:
            # IndexRefineFlat.add adds to the base (codes) and to its own f32 copy.
            self.index = faiss.IndexRefineFlat(ivf)
            self.index.k_factor = float(self.refine)
        self.index.add(K)
        inv = ivf.invlists
        self.sizes = np.array([inv.list_size(i) for i in range(nlist)], dtype=np.int64)

    def bytes_per_key(self, d):
        """Index bytes per key: the 4-bit codes and the 8-byte id (the refine's f32 copy not
        counted, as no kind counts its stored keys)."""
        return self.m / 2 + 8

    def configure(self, p):
        self.ivf.nprobe = p

    def dcs(self, Q, k):
        """Full-precision products: the centroids and the re-ranked candidates."""
        return np.full(len(Q), float(self.nlist + (self.refine or 0) * k))

    def code_estimates(self, Q, k):
        _, lists = self.ivf.quantizer.search(Q, self.ivf.nprobe)
        probed = np.where(lists >= 0, self.sizes[np.maximum(lists, 0)], 0)
        return probed.sum(axis=1).astype(np.float64)


class FaissHnsw(Peer):
    """faiss IndexHNSWFlat with inner product (faiss builds HNSW on the raw inner product)."""
    param_name = "ef"

    def __init__(self, args):
        import faiss
        self.faiss = faiss
        self.args = args

    def build(self, K):
        idx = self.faiss.IndexHNSWFlat(K.shape[1], self.args.M, self.faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = self.args.ef_construction
        idx.add(K)
        self.index = idx

    def params(self, args):
        return list(args.ef)

    def configure(self, p):
        self.index.hnsw.efSearch = p

    def search(self, Q, k):
        return self.index.search(Q, k)[1]

    def dcs(self, Q, k):
        """faiss' distance counter over one untimed batch call (upper levels included)."""
        stats = self.faiss.cvar.hnsw_stats
        stats.reset()
        self.index.search(Q, k)
        return np.full(len(Q), stats.ndis / len(Q))


class Hnsw(Peer):
    param_name = "ef"

    def __init__(self, args, l2r):
        import hnswlib
        self.hnswlib = hnswlib
        self.args = args
        self.l2r = l2r

    def _qaug(self, Q):
        if not self.l2r:
            return Q
        return np.ascontiguousarray(np.hstack([Q, np.zeros((len(Q), 1), np.float32)]))

    def build(self, K):
        n, d = K.shape
        if self.l2r:
            nn = np.einsum("ij,ij->i", K.astype(np.float64), K.astype(np.float64))
            R2 = nn.max()
            X = np.ascontiguousarray(np.hstack([K, np.sqrt(np.maximum(R2 - nn, 0.0))[:, None].astype(np.float32)]))
            space = "l2"
        else:
            X, space = K, "ip"
        idx = self.hnswlib.Index(space=space, dim=X.shape[1])
        idx.init_index(max_elements=n, ef_construction=self.args.ef_construction, M=self.args.M,
                       random_seed=self.args.seed)
        idx.set_num_threads(1)
        idx.add_items(X, np.arange(n), num_threads=1)
        self.index = idx

    def params(self, args):
        return list(args.ef)

    def configure(self, p):
        self.index.set_ef(p)

    def search(self, Q, k):
        return self.index.knn_query(self._qaug(Q), k=k, num_threads=1)[0].astype(np.int64)

    def dcs(self, Q, k):
        return None  # hnswlib exposes no distance counter


def make_peers(kind, args):
    """One peer per kind; faiss-ivf gives one per --nlist value."""
    if kind == "faiss-flat":
        return [FaissFlat(args)]
    if kind == "faiss-ivf":
        return [FaissIVF(args, nl) for nl in (args.nlist or [None])]
    if kind == "faiss-ivfpq-fs":
        return [FaissIVFPQFastScan(args)]
    if kind == "faiss-ivfpq-fs-refine":
        return [FaissIVFPQFastScan(args, r) for r in args.refine]
    return [make_peer(kind, args)]


def make_peer(kind, args):
    if kind == "faiss-hnsw":
        return FaissHnsw(args)
    if kind == "hnswlib-ip":
        return Hnsw(args, l2r=False)
    if kind == "hnswlib-l2r":
        return Hnsw(args, l2r=True)
    raise ValueError(kind)


# ----------------------------------------------------------------------------- timing
# Clock of QPS and latencies (--clock): wall time, or CPU time of the calling thread (steadier on a
# shared machine; valid because every peer search runs on the calling thread with one thread).
CLOCK = time.perf_counter


def time_batch(fn, repeat):
    ts = []
    out = None
    for _ in range(repeat):
        t0 = CLOCK()
        out = fn()
        ts.append(CLOCK() - t0)
    return out, float(np.median(ts))


def time_single(peer, Q, k, min_samples):
    """Per-query latency: each query searched alone, all queries repeated to reach min_samples."""
    if isinstance(peer, Hnsw):
        Qs = peer._qaug(Q)
        call = lambda i: peer.index.knn_query(Qs[i:i + 1], k=k, num_threads=1)
    else:
        call = lambda i: peer.index.search(Q[i:i + 1], k)
    nq = len(Q)
    rounds = max(1, -(-min_samples // nq))
    lat = np.empty(rounds * nq)
    j = 0
    pc = CLOCK
    for _ in range(rounds):
        for i in range(nq):
            t0 = pc()
            call(i)
            lat[j] = pc() - t0
            j += 1
    lat *= 1e6
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


# ----------------------------------------------------------------------------- summaries
def threshold_summary(rows, targets=TARGETS):
    """Per (index, variant, impl, layer, head, queries) and target: min scanned and best qps with recall >= target."""
    groups = {}
    for r in rows:
        key = (r["index"], r["variant"], r["impl"], r["layer"], r["head"], r["queries"])
        groups.setdefault(key, []).append(r)
    out = []
    for key, rs in groups.items():
        for t in targets:
            ok = [r for r in rs if r["recall"] >= t]
            ent = {"index": key[0], "variant": key[1], "impl": key[2], "layer": key[3], "head": key[4],
                   "queries": key[5], "target": t, "best_qps": None, "min_scanned": None}
            if ok:
                b = max(ok, key=lambda r: r["qps"])
                swept = [r for r in ok if r["params"]]
                if swept:
                    name = next(iter(swept[0]["params"]))
                    m = min(swept, key=lambda r: r["params"][name])
                    ent["min_param"] = {"params": m["params"], "qps": m["qps"], "recall": m["recall"]}
                ent["best_qps"] = {"params": b["params"], "qps": b["qps"], "scanned": b["scanned"],
                                   "recall": b["recall"]}
                withs = [r for r in ok if r["scanned"] is not None]
                if withs:
                    m = min(withs, key=lambda r: r["scanned"])
                    ent["min_scanned"] = {"params": m["params"], "qps": m["qps"], "scanned": m["scanned"],
                                          "recall": m["recall"]}
            out.append(ent)
    return out


def fmt_params(p):
    return ",".join("%s=%s" % kv for kv in p.items()) or "-"


def print_thresholds(summary):
    print("\n== smallest scanned / best QPS reaching mean recall >= target")
    print("%-5s %-12s %-7s %3s %3s %-4s %5s | %-20s %8s %9s | %-20s %9s" %
          ("index", "variant", "impl", "L", "h", "q", "tgt", "min-scan@", "scanned", "qps",
           "best-qps@", "qps"))
    for e in summary:
        head = "%-5s %-12s %-7s %3d %3d %-4s %5.2f" % (e["index"], e["variant"] or "-", e["impl"], e["layer"],
                                                       e["head"], e["queries"], e["target"])
        ms, bq = e["min_scanned"], e["best_qps"]
        a = ("%-20s %8.4f %9.0f" % (fmt_params(ms["params"]), ms["scanned"], ms["qps"])) if ms else \
            ("%-20s %8s %9s" % ("-", "n/a" if bq else "unreached", ""))
        b = ("%-20s %9.0f" % (fmt_params(bq["params"]), bq["qps"])) if bq else "%-20s %9s" % ("unreached", "")
        print(head + " | " + a + " | " + b)


def summarize_files(paths, target, queries_sets):
    rows = []
    for p in paths:
        if not os.path.isfile(p):
            die("result file %s does not exist" % p)
        with open(p) as f:
            doc = json.load(f)
        if doc.get("schema") != SCHEMA:
            die("%s: schema is %r, expected %r" % (p, doc.get("schema"), SCHEMA))
        print("# %s: dump %s, cpu %s, k=%s, %d rows" % (p, doc.get("dump"), doc.get("cpu"), doc.get("k"),
                                                         len(doc["rows"])))
        rows += doc["rows"]
    summ = threshold_summary(rows, targets=(target,))
    flat_qps = {}
    for r in rows:
        if r["impl"] == "faiss" and r["index"] == "flat":
            flat_qps[(r["layer"], r["head"], r["queries"])] = r["qps"]
    for qs in queries_sets:
        ents = [e for e in summ if e["queries"] == qs]
        if not ents:
            continue
        kinds = sorted({(e["impl"], e["index"], e["variant"]) for e in ents})
        print("\n== %s, target recall@k >= %.2f" % (qs, target))
        fq = [v for (l, h, q), v in flat_qps.items() if q == qs]
        if fq:
            print("faiss-flat qps per head: median %.0f  min %.0f  max %.0f  (%d heads)" %
                  (np.median(fq), np.min(fq), np.max(fq), len(fq)))
        for kind in kinds:
            ke = [e for e in ents if (e["impl"], e["index"], e["variant"]) == kind]
            reached = [e for e in ke if e["best_qps"]]
            name = "%s %s%s" % (kind[0], kind[1], (" " + kind[2]) if kind[2] else "")
            print("%-26s heads %d, target reached on %d" % (name, len(ke), len(reached)))
            if not reached:
                continue
            scans = [e["min_scanned"]["scanned"] for e in reached if e["min_scanned"]]
            if scans:
                print("    min scanned per head:  median %.4f  max %.4f  min %.4f" %
                      (np.median(scans), np.max(scans), np.min(scans)))
            mp = [e["min_param"]["params"] for e in reached if e.get("min_param")]
            if mp:
                name = next(iter(mp[0]))
                vals = [p[name] for p in mp]
                print("    smallest %s reaching target per head: median %g  max %g" %
                      (name, np.median(vals), np.max(vals)))
            qps = [e["best_qps"]["qps"] for e in reached]
            print("    best qps per head:     median %.0f  min %.0f  max %.0f" %
                  (np.median(qps), np.min(qps), np.max(qps)))
            ratios = [e["best_qps"]["qps"] / flat_qps[(e["layer"], e["head"], qs)] for e in reached
                      if (e["layer"], e["head"], qs) in flat_qps]
            if ratios and kind != ("faiss", "flat", ""):
                print("    qps / faiss-flat qps:  median %.2f  min %.2f  max %.2f" %
                      (np.median(ratios), np.min(ratios), np.max(ratios)))


# ----------------------------------------------------------------------------- main benchmark
def run(args):
    global CLOCK
    CLOCK = time.thread_time if args.clock == "thread-cpu" else time.perf_counter
    import faiss
    faiss.omp_set_num_threads(1)
    dump = Dump(args.dump)
    layers = args.layers if args.layers is not None else dump.layers
    for L in layers:
        if L not in dump.layers:
            die("layer %d is not in the dump (layers %s)" % (L, dump.layers))
    heads = args.heads if args.heads is not None else list(range(dump.n_q_heads))
    for h in heads:
        if not 0 <= h < dump.n_q_heads:
            die("query head %d out of range (n_q_heads = %d)" % (h, dump.n_q_heads))
    for kd in args.kinds:
        if kd not in ALL_KINDS:
            die("unknown kind %r (known: %s)" % (kd, ",".join(ALL_KINDS)))
    for q in args.queries:
        if q not in ("q2k", "k2k"):
            die("unknown query set %r (known: q2k,k2k)" % q)
    k = args.k
    rows = []
    print("# dump %s: d=%d, %d q heads, %d kv heads, layers %s; k=%d, kinds %s, queries %s, single thread" %
          (args.dump, dump.d, dump.n_q_heads, dump.n_kv_heads, layers, k, ",".join(args.kinds),
           ",".join(args.queries)))
    print("%-5s %-12s %-7s %3s %3s %-4s %-20s %7s %8s %10s %9s %9s %8s %7s" %
          ("index", "variant", "impl", "L", "h", "q", "params", "recall", "scanned", "dist", "qps",
           "p50us", "p99us", "mass"))
    t_start = time.time()
    for L in layers:
        Kall = dump.load(L, "k")
        src = {"q2k": dump.load(L, "qdec") if "q2k" in args.queries else None,
               "k2k": dump.load(L, "kdec") if "k2k" in args.queries else None}
        kv_heads = sorted({dump.kv_head(h) for h in heads})
        for kvh in kv_heads:
            K = f32(Kall[kvh])
            n = K.shape[0]
            if k > n:
                die("k=%d > number of keys %d" % (k, n))
            built = []
            for kind in args.kinds:
                for peer in make_peers(kind, args):
                    t0 = time.perf_counter()
                    peer.build(K)
                    built.append((kind, peer, time.perf_counter() - t0))
            for h in [h for h in heads if dump.kv_head(h) == kvh]:
                for qs in args.queries:
                    Q = f32(src[qs][h] if qs == "q2k" else src[qs][kvh])
                    exact, S = exact_topk(Q, K, k)
                    mass = Mass(S, dump.d, exact)
                    del S
                    for kind, peer, build_s in built:
                        index, variant, impl = KIND_META[kind]
                        variant = getattr(peer, "variant", variant)
                        for p in peer.params(args):
                            peer.configure(p)
                            ids, tb = time_batch(lambda: peer.search(Q, k), args.repeat)
                            p50, p99 = time_single(peer, Q, k, args.latency_samples)
                            dc = peer.dcs(Q, k)
                            est = peer.code_estimates(Q, k) if hasattr(peer, "code_estimates") else None
                            row = {"index": index, "variant": variant, "impl": impl, "layer": L, "head": h,
                                   "queries": qs,
                                   "params": {} if p is None else {peer.param_name: int(p)},
                                   "recall": recall_at_k(ids, exact, k),
                                   "scanned": None if dc is None else float(dc.mean() / n),
                                   "distance_computations": None if dc is None else float(dc.mean()),
                                   "code_estimates": None if est is None else float(est.mean()),
                                   "bytes_per_key": (peer.bytes_per_key(dump.d)
                                                     if hasattr(peer, "bytes_per_key") else None),
                                   "qps": len(Q) / tb,
                                   "latency_us": {"p50": p50, "p99": p99},
                                   "build_s": {"total": build_s},
                                   "mass_ratio": mass.ratio(ids),
                                   "output_cosine": None}
                            if kind.startswith("faiss-ivf"):
                                row["params"]["nlist"] = peer.nlist  # informational, not swept
                            rows.append(row)
                            print("%-5s %-12s %-7s %3d %3d %-4s %-20s %7.4f %8s %10s %9.0f %9.1f %8.1f %7.4f" %
                                  (index, variant or "-", impl, L, h, qs, fmt_params(row["params"]),
                                   row["recall"],
                                   "-" if dc is None else "%.4f" % row["scanned"],
                                   "-" if dc is None else "%.0f" % row["distance_computations"],
                                   row["qps"], p50, p99, row["mass_ratio"]), flush=True)
    summary = threshold_summary(rows)
    print_thresholds(summary)
    doc = {"schema": SCHEMA, "dump": os.path.abspath(args.dump), "cpu": cpu_name(), "k": k,
           "config": {"kinds": args.kinds, "queries": args.queries, "layers": layers, "heads": heads,
                      "ef": args.ef, "nprobe": args.nprobe, "nlist": args.nlist, "ivf_iters": args.ivf_iters,
                      "M": args.M, "ef_construction": args.ef_construction, "repeat": args.repeat,
                      "latency_samples": args.latency_samples, "seed": args.seed, "threads": 1,
                      "clock": args.clock,
                      "faiss": faiss.__version__, "numpy": np.__version__,
                      "python": platform.python_version()},
           "rows": rows, "summary": summary}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print("\n# wrote %s (%d rows) in %.0fs" % (args.out, len(rows), time.time() - t_start))


VENV_MARK = "QKINDEX_PEERS_VENV"


def ensure_venv(argv):
    """Re-runs this script inside a virtual environment holding benches/requirements-peers.txt.

    The environment is created on first use and pip runs again only when the requirements file
    changes (its sha256 is kept in the environment). --no-venv skips all of this.
    """
    if "--no-venv" in argv or os.environ.get(VENV_MARK) == "1":
        return
    here = os.path.dirname(os.path.abspath(__file__))
    venv = os.path.join(here, ".venv-peers")
    for i, a in enumerate(argv):
        if a == "--venv" and i + 1 < len(argv):
            venv = argv[i + 1]
        elif a.startswith("--venv="):
            venv = a.split("=", 1)[1]
    venv = os.path.abspath(venv)
    req = os.path.join(here, "requirements-peers.txt")
    py = os.path.join(venv, "bin", "python")
    with open(req, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(venv, ".requirements-peers.sha256")
    if not os.path.exists(py):
        print("# creating virtual environment %s" % venv, file=sys.stderr, flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    have = open(stamp).read().strip() if os.path.exists(stamp) else ""
    if have != digest:
        print("# installing %s into %s" % (req, venv), file=sys.stderr, flush=True)
        subprocess.check_call([py, "-m", "pip", "install", "--quiet", "-r", req])
        with open(stamp, "w") as f:
            f.write(digest + "\n")
    env = dict(os.environ)
    env[VENV_MARK] = "1"
    os.execve(py, [py, os.path.abspath(__file__)] + argv, env)


def main():
    ensure_venv(sys.argv[1:])
    if np is None:
        die("numpy is not installed (run without --no-venv to install the requirements)")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", help="dump directory (manifest.json + layerLL.{k,qdec,kdec}.npy)")
    ap.add_argument("--layers", type=int_list, default=None, help="model layer numbers (default: all in the dump)")
    ap.add_argument("--heads", type=int_list, default=None, help="query heads (default: all)")
    ap.add_argument("--kinds", type=str_list, default=["faiss-flat", "faiss-ivf", "hnswlib-l2r"],
                    help="comma list of %s (default faiss-flat,faiss-ivf,hnswlib-l2r)" % ",".join(ALL_KINDS))
    ap.add_argument("--k", type=int, default=100, help="neighbours per query (default 100)")
    ap.add_argument("--queries", type=str_list, default=["q2k", "k2k"], help="q2k,k2k (default both)")
    ap.add_argument("--ef", type=int_list, default=int_list(DEFAULT_EF),
                    help="hnswlib / faiss-hnsw ef sweep (default %s)" % DEFAULT_EF)
    ap.add_argument("--nprobe", type=int_list, default=int_list(DEFAULT_NPROBE),
                    help="faiss IVF nprobe sweep, values > nlist dropped (default %s)" % DEFAULT_NPROBE)
    ap.add_argument("--nlist", type=int_list, default=None,
                    help="faiss IVF list counts, comma list: one IVF index per value (default round(4*sqrt(n)))")
    ap.add_argument("--refine", type=int_list, default=[2, 4, 8],
                    help="k_factor values of faiss-ivfpq-fs-refine, one peer each (default 2,4,8)")
    ap.add_argument("--ivf-iters", type=int, default=10, help="faiss IVF k-means iterations (default 10, faiss' default)")
    ap.add_argument("--M", type=int, default=16,
                    help="HNSW M of hnswlib and faiss-hnsw (default 16, as qkindex bench --kinds hnsw:m=16)")
    ap.add_argument("--ef-construction", type=int, default=200,
                    help="HNSW ef_construction of hnswlib and faiss-hnsw (default 200, as qkindex bench --kinds hnsw:ef-construction=200)")
    ap.add_argument("--repeat", type=int, default=3, help="batch-call repetitions; QPS uses the median (default 3)")
    ap.add_argument("--latency-samples", type=int, default=1000,
                    help="minimum single-query calls for p50/p99 (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="seed for k-means and HNSW levels (default 0)")
    ap.add_argument("--out", help="write the qkindex-bench/1 JSON here")
    ap.add_argument("--clock", choices=["wall", "thread-cpu"], default="wall",
                    help="clock of QPS and latencies, as qkindex bench --clock: wall (default) or thread-cpu "
                         "(CPU time of the searching thread; time spent descheduled does not count)")
    ap.add_argument("--venv", default=None,
                    help="virtual environment to install the requirements into and run in (default benches/.venv-peers)")
    ap.add_argument("--no-venv", action="store_true",
                    help="run with the current python and its packages (no virtual environment, no pip)")
    ap.add_argument("--summary", nargs="+", metavar="FILE.json",
                    help="summary mode: read result files (no benchmark run) and print per-head medians")
    ap.add_argument("--target", type=float, default=0.95, help="summary mode recall target (default 0.95)")
    args = ap.parse_args()
    if args.summary:
        summarize_files(args.summary, args.target, args.queries)
        return
    if not args.dump:
        ap.error("--dump is required unless --summary is given")
    if args.k < 1 or args.repeat < 1:
        ap.error("--k and --repeat must be >= 1")
    if any(e < 1 for e in args.ef) or any(p < 1 for p in args.nprobe):
        ap.error("--ef and --nprobe values must be >= 1")
    run(args)


if __name__ == "__main__":
    main()
