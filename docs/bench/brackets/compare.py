#!/usr/bin/env python3
"""Both pruning rules from `qkindex bench` outputs: per target, the median over heads of the
fewest keys scanned reaching recall@100 (each head's sweep bracketing the target), and per-head
wins. Usage: compare.py NAME=bench.json ... (rows labelled by their variant: `prune=top` and ``,
today's default occlusion-fill)."""
import json, statistics, sys

TARGETS = (0.95, 0.99)


def fewest(rows, target):
    """(layer, head) -> (fewest scanned reaching target or None, bracketed)."""
    by = {}
    for r in rows:
        by.setdefault((r["layer"], r["head"]), []).append(r)
    out = {}
    for key, rs in by.items():
        ok = [r["scanned"] for r in rs if r["recall"] >= target]
        below = any(r["recall"] < target for r in rs)
        out[key] = (min(ok) if ok else None, bool(ok) and below)
    return out


print("| set | target | heads | top: median scanned | occlusion-fill: median scanned | fill / top | heads top fewer | fill fewer | ties | not bracketed |")
print("|---|---|---|---|---|---|---|---|---|---|")
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    rows = [r for r in json.load(open(path))["rows"] if r["index"] == "attention" and r["k"] == 100 and r["queries"] == "q2k"]
    top = [r for r in rows if r["variant"] == "prune=top"]
    fill = [r for r in rows if r["variant"] in ("", "prune=occlusion-fill")]
    for t in TARGETS:
        a, b = fewest(top, t), fewest(fill, t)
        heads = sorted(set(a) & set(b))
        ma = [a[h][0] for h in heads if a[h][0] is not None]
        mb = [b[h][0] for h in heads if b[h][0] is not None]
        wa = sum(1 for h in heads if a[h][0] is not None and (b[h][0] is None or a[h][0] < b[h][0]))
        wb = sum(1 for h in heads if b[h][0] is not None and (a[h][0] is None or b[h][0] < a[h][0]))
        unb = sum(1 for h in heads for x in (a, b) if not x[h][1])
        med_a, med_b = statistics.median(ma), statistics.median(mb)
        print(f"| {name} | {t} | {len(heads)} (top {len(ma)}, fill {len(mb)} reach) | {med_a:.4f} | {med_b:.4f} | {med_b / med_a:.3f} | {wa} | {wb} | {len(heads) - wa - wb} | {unb} |")
