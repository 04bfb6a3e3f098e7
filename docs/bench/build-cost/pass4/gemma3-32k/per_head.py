"""Per-head ratio of the minimum scanned fraction reaching a recall target, variant against today's.

usage: python3 per_head.py bench.json VARIANT   (prints one line per target: ratios by (layer, head))
"""
import json
import sys


def main(path, variant):
    rows = json.load(open(path))["rows"]
    for target in (0.95, 0.99):
        best = {}
        for r in rows:
            if r["recall"] >= target:
                key = (r["layer"], r["head"], r["variant"] or "today")
                best[key] = min(best.get(key, 9.0), r["scanned"])
        heads = sorted({(l, h) for (l, h, _) in best})
        out = []
        for l, h in heads:
            a, b = best.get((l, h, "today")), best.get((l, h, variant))
            out.append(f"L{l}h{h} " + (f"{b / a:.2f}" if a and b else "not reached"))
        print(target, "; ".join(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
