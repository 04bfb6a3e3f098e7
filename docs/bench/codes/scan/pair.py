"""Per head, the best QPS of one series over another's at each recall@100 target (q2k), from one
bench.json: python3 pair.py bench.json[.gz] SERIES_A SERIES_B [--targets 0.95,0.99]
(a series is `index` or `index:variant`, e.g. `flat:codes=i4`)."""
import gzip
import json
import statistics as st
import sys

args = sys.argv[1:]
targets = [0.95, 0.99]
if "--targets" in args:
    i = args.index("--targets")
    targets = [float(t) for t in args[i + 1].split(",")]
    del args[i:i + 2]
path, a, b = args
rows = [r for r in json.load((gzip.open if path.endswith(".gz") else open)(path, "rt"))["rows"] if r["queries"] == "q2k"]
name = lambda r: r["index"] + (":" + r["variant"] if r["variant"] else "")
heads = sorted({(r["layer"], r["head"]) for r in rows})
for t in targets:
    best = {}
    for r in rows:
        if r["recall"] >= t:
            key = (name(r), r["layer"], r["head"])
            best[key] = max(best.get(key, 0.0), r["qps"])
    ra = [best[(a, *h)] / best[(b, *h)] for h in heads if (a, *h) in best and (b, *h) in best]
    na = sum((a, *h) in best for h in heads)
    nb = sum((b, *h) in best for h in heads)
    med = f"{st.median(ra):.2f} ({min(ra):.2f}–{max(ra):.2f})" if ra else "—"
    print(f"recall >= {t}: {a} reaches {na}/{len(heads)}, {b} {nb}/{len(heads)}; "
          f"per head {a} / {b} QPS: median {med} over {len(ra)} heads")
