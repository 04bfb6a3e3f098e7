"""Issue 26 must-show from one bench.json (qkindex) and one peers.json (faiss), same dump.

usage: python3 summarize.py bench.json[.gz] peers.json[.gz] [--targets 0.95,0.99]

Per (impl, index, variant): heads reaching each recall@100 target (mean recall over the decode
queries, q2k), the median over heads of the best QPS among settings reaching it, of the fewest
full-precision products per key ("scanned") and of code estimates per key. Then, per head, the
best QPS of each of our series (every qkindex kind but our plain IVF, a peer, and the exact
scan) over the best QPS of any peer (our IVF, faiss IVF-Flat, IVF-PQ
fast-scan with or without refine) reaching the target on that head; a head no peer reaches
counts as a win and is listed separately.
"""
import collections
import gzip
import json
import statistics as st
import sys

args = sys.argv[1:]
targets = [0.95, 0.99]
if "--targets" in args:
    i = args.index("--targets")
    targets = [float(t) for t in args[i + 1].split(",")]
    del args[i:i + 2]
rows = []
for path in args:
    rows += [r for r in json.load((gzip.open if path.endswith(".gz") else open)(path, "rt"))["rows"] if r["queries"] == "q2k"]
heads = sorted({(r["layer"], r["head"]) for r in rows})
name = lambda r: (r["impl"], r["index"] + (":" + r["variant"] if r["variant"] else ""))
PEERS = {("qkindex", "ivf")} | {n for n in map(name, rows) if n[0] == "faiss" and n[1] != "flat"}
n_keys = {}
for r in rows:
    if r.get("scanned") and r.get("distance_computations"):
        n_keys[(r["layer"], r["head"])] = r["distance_computations"] / r["scanned"]

for t in targets:
    best = collections.defaultdict(dict)  # name -> head -> row with best qps
    least = collections.defaultdict(dict)  # name -> head -> fewest scanned
    for r in rows:
        if r["recall"] < t:
            continue
        h, v = (r["layer"], r["head"]), name(r)
        if h not in best[v] or r["qps"] > best[v][h]["qps"]:
            best[v][h] = r
        s = r.get("scanned")
        if s is not None and (h not in least[v] or s < least[v][h]):
            least[v][h] = s
    print(f"\n### recall@100 >= {t}, q2k, {len(heads)} heads\n")
    print("| impl | index | heads reaching | median best QPS | median fewest scanned (full precision) | code estimates / key at best QPS | bytes/key |")
    print("|---|---|---|---|---|---|---|")
    for v in sorted(set(map(name, rows))):
        hs = best.get(v, {})
        if not hs:
            print(f"| {v[0]} | {v[1]} | 0/{len(heads)} | — | — | — | — |")
            continue
        q = st.median(r["qps"] for r in hs.values())
        s = [x for x in least[v].values()]
        ce = [r["code_estimates"] / n_keys[h] for h, r in hs.items() if r.get("code_estimates") and h in n_keys]
        b = [r["bytes_per_key"] for r in hs.values() if r.get("bytes_per_key") is not None]
        f = lambda xs, p: (f"{st.median(xs):.{p}f}" if xs else "—")
        print(f"| {v[0]} | {v[1]} | {len(hs)}/{len(heads)} | {q:.0f} | {f(s, 4)} | {f(ce, 3)} | {f(b, 1)} |")
    # Every qkindex series but the peer (our IVF on f16 lists) and the exact scan.
    ours_all = sorted(v for v in set(map(name, rows)) if v[0] == "qkindex" and v not in PEERS and v[1] != "flat")
    for ours in ours_all:
        if ours not in best or len(best[ours]) < len(heads):
            print(f"\n{ours[1]}: reaches {t} on {len(best.get(ours, {}))}/{len(heads)} heads")
            continue
        ratios, unmatched = [], 0
        for h in heads:
            peer = max((best[p][h]["qps"] for p in PEERS if h in best.get(p, {})), default=None)
            if peer is None:
                unmatched += 1
            else:
                ratios.append(best[ours][h]["qps"] / peer)
        med = f"{st.median(ratios):.2f}" if ratios else "—"
        rng = f"{min(ratios):.2f}–{max(ratios):.2f}" if ratios else "—"
        print(f"\n{ours[1]} / best peer on the same head: median {med} (range {rng}) over "
              f"{len(ratios)} heads some peer reaches; {unmatched} heads no peer reaches")
