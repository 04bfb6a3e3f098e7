#!/usr/bin/env python3
"""Markdown summary of `qkindex bench` (and `benches/peers.py`) JSON files.

    python3 scripts/bench-summary.py bench-out/real/bench.json [bench-out/peers.json ...]

Per (impl, index, variant, queries) and recall target: how many heads reach it, the median and
max over heads of the fewest keys scanned, and the median over heads of best QPS divided by the
same run's exact scan of that head (qkindex FlatIndex for qkindex rows, faiss IndexFlatIP for
peer rows). Then per layer, for AttentionIndex on q2k: min scanned at 0.95 per head.
"""
import collections
import json
import statistics
import sys


def main():
    rows = []
    for path in sys.argv[1:]:
        with open(path) as f:
            rows += json.load(f)["rows"]
    flat = {}
    for r in rows:
        if r["index"] == "flat":
            flat[(r["impl"], r["layer"], r["head"], r["queries"])] = r["qps"]
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["impl"], r["index"], r["variant"], r["queries"], r["layer"], r["head"])].append(r)
    for target in (0.90, 0.95, 0.99):
        print(f"\n### recall@k ≥ {target}\n")
        print("| impl | index | variant | queries | heads reaching | median min scanned | max min scanned | median QPS / exact scan |")
        print("|---|---|---|---|---|---|---|---|")
        agg = collections.defaultdict(lambda: {"heads": 0, "scanned": [], "ratio": []})
        for (impl, index, variant, queries, layer, head), rs in sorted(groups.items()):
            a = agg[(impl, index, variant, queries)]
            a["heads"] += 1
            ok = [r for r in rs if r["recall"] >= target]
            if not ok:
                continue
            sc = [r["scanned"] for r in ok if r["scanned"] is not None]
            if sc:
                a["scanned"].append(min(sc))
            f = flat.get((impl, layer, head, queries))
            if f:
                a["ratio"].append(max(r["qps"] for r in ok) / f)
        for (impl, index, variant, queries), a in sorted(agg.items()):
            med = lambda v, p: f"{statistics.median(v):.{p}f}" if v else "—"
            mx = lambda v, p: f"{max(v):.{p}f}" if v else "—"
            print(f"| {impl} | {index} | {variant} | {queries} | {len(a['ratio']) or len(a['scanned'])}/{a['heads']} "
                  f"| {med(a['scanned'], 4)} | {mx(a['scanned'], 4)} | {med(a['ratio'], 2)} |")
    print("\n### AttentionIndex, q2k: fewest keys scanned for recall ≥ 0.95, per layer (one value per head)\n")
    print("| layer | per head | median |")
    print("|---|---|---|")
    per_layer = collections.defaultdict(list)
    for (impl, index, variant, queries, layer, head), rs in sorted(groups.items()):
        if impl == "qkindex" and index == "attention" and variant == "" and queries == "q2k":
            ok = [r["scanned"] for r in rs if r["recall"] >= 0.95]
            per_layer[layer].append(min(ok) if ok else None)
    for layer, v in sorted(per_layer.items()):
        vals = [x for x in v if x is not None]
        cells = " ".join("—" if x is None else f"{x:.3f}" for x in v)
        print(f"| {layer} | {cells} | {statistics.median(vals):.3f} |" if vals else f"| {layer} | {cells} | — |")


if __name__ == "__main__":
    main()
