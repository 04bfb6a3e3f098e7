"""Build seconds, scanned fractions and the growth exponent of each builder against n.

usage: python3 summarize.py DIR   (DIR holds n*/bench.json from synth-scale.sh)

Scanned at a recall target is interpolated linearly between the last ef below it and the
first that reaches it (as docs/bench/build-cost/pass5/per_head.py does); the exponent is the
least-squares slope of log build seconds on log n.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from growth import exponent  # noqa: E402


def scanned_at(rows, target):
    pts = sorted((r["scanned"], r["recall"]) for r in rows)
    for (s0, r0), (s1, r1) in zip([(0.0, 0.0)] + pts, pts):
        if r1 >= target:
            return s1 if r1 == r0 else s0 + (s1 - s0) * (target - r0) / (r1 - r0)
    return None


def main(out):
    table = {}
    for path in sorted(glob.glob(os.path.join(out, "n*", "bench.json"))):
        d = json.load(open(path))
        for name in sorted({r["variant"] for r in d["rows"]}):
            rows = [r for r in d["rows"] if r["variant"] == name]
            table[(name or "today (exact kNN)", d["n_keys"])] = (rows[0]["build_s"], rows)
    fmt = lambda x: "not reached" if x is None else f"{x:.4f}"
    print("| builder | n | build s (knn + projection) | scanned @0.95 | scanned @0.99 | best recall |")
    print("|---|---|---|---|---|---|")
    for (name, n), (b, rows) in sorted(table.items()):
        print(f"| {name} | {n:,} | {b['total']:.2f} ({b['knn']:.2f} + {b['projection']:.2f}) | "
              f"{fmt(scanned_at(rows, 0.95))} | {fmt(scanned_at(rows, 0.99))} | "
              f"{max(r['recall'] for r in rows):.4f} |")
    print()
    for name in sorted({k[0] for k in table}):
        pts = sorted((n, b["total"]) for (v, n), (b, _) in table.items() if v == name)
        if len(pts) < 2:
            continue
        slope, steps = exponent(pts)
        print(f"- {name}: growth exponent {slope:.2f} ({pts[0][0]:,}–{pts[-1][0]:,} keys; steps {steps})")


if __name__ == "__main__":
    main(sys.argv[1])
