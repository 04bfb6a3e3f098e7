"""Per-head QPS against flat of the 32K structure runs (docs/bench/qwen/README.md, "The walk on
codes and per-head routes at 32K"): for each query head of layers 5 and 17, the best
single-thread QPS among the settings reaching recall@100 >= 0.95, divided by the same run's
exact scan of that head (each run's own `flat`, since QPS of one head moves between runs).

    python3 docs/bench/qwen/analysis/structures.py docs/bench/qwen/structures-32k
"""
import collections
import csv
import io
import lzma
import statistics
import sys

TARGET = 0.95


def best(path):
    """(layer, head) -> kind -> (best QPS at the target, fewest scanned there)."""
    out = collections.defaultdict(dict)
    with lzma.open(path, "rt") as f:
        for r in csv.DictReader(io.StringIO(f.read())):
            if r["queries"] != "q2k" or float(r["recall"]) < TARGET:
                continue
            v = r["variant"]
            v = "default" if v.startswith("causal") else v
            kind = r["index"] + (":" + v if v else "")
            key = (int(r["layer"]), int(r["head"]))
            q, s = float(r["qps"]), float(r["scanned"])
            old = out[key].get(kind, (0.0, 9.0))
            out[key][kind] = (max(old[0], q), min(old[1], s))
    return out


def main(root):
    inline = best(f"{root}/inline/bench.csv.xz")
    before = best(f"{root}/default/bench.csv.xz")
    alone = best(f"{root}/per-head-alone/bench.csv.xz")
    routes = best(f"{root}/group-then-heads/bench.csv.xz")
    cols = [
        ("graph (f16 walk)", inline, "attention"),
        ("walk on inline int8", inline, "attention:codes=i8-inline"),
        ("ivf:codes=i8", inline, "ivf:codes=i8"),
        ("default, group choice", before, "attention:default"),
        ("flat:codes=i8", routes, "flat:codes=i8"),
        ("default, each head alone", alone, "attention:default"),
        ("default, group then heads", routes, "attention:default"),
    ]
    print("| layer, head | " + " | ".join(c[0] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    ratios = collections.defaultdict(list)
    for key in sorted(routes):
        cells = []
        for name, run, kind in cols:
            r = run[key][kind][0] / run[key]["flat"][0]
            ratios[(key[0], name)].append(r)
            ratios[("all", name)].append(r)
            cells.append(f"{r:.1f}")
        print(f"| L{key[0]} h{key[1]} | " + " | ".join(cells) + " |")
    for group in (5, 17, "all"):
        label = f"layer {group}" if group != "all" else "all 24"
        med = [statistics.median(ratios[(group, c[0])]) for c in cols]
        low = [min(ratios[(group, c[0])]) for c in cols]
        print(f"| **{label}: median** | " + " | ".join(f"**{m:.2f}**" for m in med) + " |")
        print(f"| {label}: worst head | " + " | ".join(f"{m:.2f}" for m in low) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/bench/qwen/structures-32k")
