"""Per-head scanned fraction at a recall target, each variant against today's builder.

usage: python3 per_head.py bench.json [bench.json ...] [--base VARIANT]

For each (layer, head, variant) the recall/scanned points of the ef sweep are sorted by
scanned fraction; the fraction at the target is the first grid point reaching it ("grid") and
the linear interpolation between that point and the one before it ("interp"), so that a coarse
ef grid does not quantise the ratio. Prints, per target and variant, the ratio to the base
variant on every head, the median and the worst ratio, and how many heads reach the target.
"""
import json
import statistics
import sys


def curves(paths):
    out = {}
    for path in paths:
        rows = json.load(open(path))["rows"]
        for r in rows:
            if r.get("queries") not in (None, "q2k") or r.get("k", 100) != 100:
                continue
            key = (r["layer"], r["head"], r["variant"] or "today")
            out.setdefault(key, []).append((r["scanned"], r["recall"]))
    return {k: sorted(v) for k, v in out.items()}


def at(points, target, interp):
    prev = None
    for s, rec in points:
        if rec >= target:
            if interp and prev is not None and prev[1] < target:
                s0, r0 = prev
                return s0 + (s - s0) * (target - r0) / (rec - r0)
            return s
        if prev is None or rec > prev[1]:
            prev = (s, rec)
    return None


def main(argv):
    base = "today"
    if "--base" in argv:
        i = argv.index("--base")
        base = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    c = curves(argv)
    heads = sorted({(l, h) for (l, h, _) in c})
    variants = sorted({v for (_, _, v) in c} - {base})
    for target in (0.95, 0.99):
        for mode in ("grid", "interp"):
            print(f"## recall {target}, {mode}")
            for v in variants:
                ratios, cells, reached = [], [], 0
                for l, h in heads:
                    a = c.get((l, h, base)) and at(c[(l, h, base)], target, mode == "interp")
                    b = c.get((l, h, v)) and at(c[(l, h, v)], target, mode == "interp")
                    reached += b is not None
                    if a and b:
                        ratios.append(b / a)
                        cells.append(f"L{l}h{h} {b / a:.2f}")
                    else:
                        cells.append(f"L{l}h{h} " + ("—" if b else "not reached"))
                summary = (
                    f"median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}"
                    if ratios
                    else "no ratio"
                )
                print(f"{v}: {reached}/{len(heads)} heads, {summary}")
                print("    " + "; ".join(cells))
            print()


if __name__ == "__main__":
    main(sys.argv[1:])
