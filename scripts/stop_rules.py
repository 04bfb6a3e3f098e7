#!/usr/bin/env python3
"""Summarises `cargo run --release -p qkindex --example stop_rules` rows (CSV on stdin or a
file): per stop rule (patience × seeds), the cheapest `ef` cap at which each head's mean
recall@100 over its decode queries reaches the target, and the median and mean over heads of
the inner products that costs, as a share of the keys. A head that never reaches the target
counts at its most expensive setting. Standard library only.

    python3 scripts/stop_rules.py rows.csv [--target 0.95] [--at-ef 128,256]

With `--at-ef`, also one table per listed `ef` with every rule at that fixed cap: the mean
recall@100 and the mean share of the keys scored over all heads (the decode's view: one `ef`
per head, not the cheapest one per head).
"""
import argparse
import csv
import statistics
import sys
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="?", default="-")
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--at-ef", default="", help="comma-separated ef caps for the fixed-ef tables")
    a = ap.parse_args()
    f = sys.stdin if a.rows == "-" else open(a.rows)
    by = defaultdict(list)  # (patience, seeds) -> head -> [(dist, recall, ef, n)]
    heads = set()
    all_rows = list(csv.DictReader(f))
    for r in all_rows:
        key = (int(r["patience"]), int(r["seeds"]))
        head = (int(r["layer"]), int(r["head"]))
        heads.add(head)
        by[key].append((head, float(r["dist"]), float(r["recall"]), int(r.get("beam") or r["ef"]), int(r["n"])))
    print(f"{len(heads)} heads, target recall@100 {a.target}")
    print("| patience | seeds | heads reached | median scanned | mean scanned | worst head | median ef (or beam below 100) |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for key in sorted(by, key=lambda k: (k[1], k[0] if k[0] else 10**9)):
        per = defaultdict(list)
        for head, dist, rec, ef, n in by[key]:
            per[head].append((dist, rec, ef, n))
        fracs, efs, reached = [], [], 0
        for head, rows in per.items():
            ok = [r for r in rows if r[1] >= a.target]
            if ok:
                reached += 1
                best = min(ok)
            else:
                best = max(rows)
            fracs.append(best[0] / best[3])
            efs.append(best[2])
        med, mean = statistics.median(fracs), statistics.fmean(fracs)
        if key == (0, 0):
            base = mean
        rel = f" ({mean / base:.2f}×)" if base else ""
        p = "none" if key[0] == 0 else str(key[0])
        print(f"| {p} | {key[1]} | {reached}/{len(per)} | {100*med:.2f} % | {100*mean:.2f} %{rel} "
              f"| {100*max(fracs):.2f} % | {statistics.median(efs):.0f} |")


    for ef in [int(x) for x in a.at_ef.split(",") if x]:
        fixed(all_rows, ef)


def fixed(rows, ef):
    """Every rule at one `ef` cap (list size = ef): mean recall and mean share scored."""
    sel = defaultdict(list)
    for r in rows:
        if int(r["ef"]) == ef and int(r.get("beam") or ef) == ef:
            sel[(int(r["patience"]), int(r["seeds"]))].append(r)
    if not sel:
        print(f"\nno rows at ef {ef}")
        return
    print(f"\nat ef {ef} on every head")
    print("| patience | seeds | mean recall@100 | mean scanned | vs no rule |")
    print("|---|---|---|---|---|")
    def share(rs):
        return statistics.fmean(float(r["dist"]) / int(r["n"]) for r in rs)

    base = share(sel[(0, 0)]) if (0, 0) in sel else None
    for key in sorted(sel, key=lambda k: (k[1], k[0] if k[0] else 10**9)):
        rs = sel[key]
        rec = statistics.fmean(float(r["recall"]) for r in rs)
        frac = share(rs)
        rel = f"{frac / base:.2f}×" if base else "—"
        p = "none" if key[0] == 0 else str(key[0])
        print(f"| {p} | {key[1]} | {rec:.4f} | {100*frac:.2f} % | {rel} |")


if __name__ == "__main__":
    main()
