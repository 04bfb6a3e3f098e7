#!/usr/bin/env python3
"""The decode default's three pruning variants (decode-default.sh) in bench.json files: per
variant the median over heads of the fewest keys scanned reaching recall@100 0.95 and 0.99 (each
head's sweep bracketing the target), the heads bracketed, the median build seconds; then per
pair of variants the median over heads of the ratio of their fewest keys.
Usage: compare_variants.py NAME=bench.json ..."""
import json, statistics, sys


def label(v):
    if "prune-check=" in v:
        return "occlusion-fill + prune-check=top"
    if "prune=top" in v:
        return "top"
    return "occlusion-fill"

for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    rep = json.load(open(path))
    rows = [r for r in rep["rows"] if r["index"] == "attention" and r["k"] == 100 and r["queries"] == "q2k"]
    variants = sorted({r["variant"] for r in rows})
    print(f"\n{name}")
    print("| variant | target | heads reaching | median fewest scanned | bracketed | median build s |")
    print("|---|---|---|---|---|---|")
    per = {}
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]
        by = {}
        for r in rs:
            by.setdefault((r["layer"], r["head"]), []).append(r)
        builds = [r["build_s"].get("total") for r in rs if isinstance(r.get("build_s"), dict) and r["build_s"].get("total") is not None]
        for t in (0.95, 0.99):
            fewest = {}
            br = 0
            for key, hr in by.items():
                ok = [r["scanned"] for r in hr if r["recall"] >= t]
                if ok:
                    fewest[key] = min(ok)
                    br += any(r["recall"] < t for r in hr)
            per[(v, t)] = fewest
            med = statistics.median(fewest.values()) if fewest else float("nan")
            bmed = statistics.median(builds) if builds else float("nan")
            print(f"| {label(v)} | {t} | {len(fewest)}/{len(by)} | {med:.4f} | {br} | {bmed:.2f} |")
    print()
    for t in (0.95, 0.99):
        ratios = {}
        for v in variants:
            for w in variants:
                if v < w:
                    a, b = per[(v, t)], per[(w, t)]
                    keys = a.keys() & b.keys()
                    if keys:
                        r = statistics.median(b[k] / a[k] for k in keys)
                        print(f"{t}: median per-head ratio {label(w)} / {label(v)} = {r:.3f} over {len(keys)} heads")
