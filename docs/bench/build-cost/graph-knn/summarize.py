"""Build seconds and scanned fractions against n from the bench.json files of synth-scale.sh.

usage: python3 summarize.py DIR [DIR ...]   (each holds n*/bench.json or bench-n*.json)

At 8,192 training queries the graph kNN is the exact kNN (its floor): that row serves both.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from growth import print_summary  # noqa: E402


def min_scanned(rows, target):
    ok = [r["scanned"] for r in rows if r["recall"] >= target]
    return min(ok) if ok else None


def main(dirs):
    table = {}
    paths = [p for out in dirs for pat in ("n*/bench.json", "bench-n*.json", "bench-n*-today.json", "bench-n*-kg256.json")
             for p in glob.glob(os.path.join(out, pat))]
    for path in sorted(paths):
        d = json.load(open(path))
        n = d["n_keys"]
        for name in sorted({r["variant"] for r in d["rows"]}):
            rows = [r for r in d["rows"] if r["variant"] == name]
            table[(name or "today", n)] = (rows[0]["build_s"], rows)
    if ("knn-graph=128", 8192) not in table and ("today", 8192) in table:
        table[("knn-graph=128", 8192)] = table[("today", 8192)]
    print_summary(table, min_scanned)


if __name__ == "__main__":
    main(sys.argv[1:])
