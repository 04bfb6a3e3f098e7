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
from growth import print_summary  # noqa: E402


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
    print_summary(table, scanned_at)


if __name__ == "__main__":
    main(sys.argv[1])
