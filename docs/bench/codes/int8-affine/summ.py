import json,sys,statistics as st
for name in sys.argv[1:]:
    rows=json.load(open(name+".bench.json"))["rows"]
    for qs in ("q2k","k2k"):
        r=[x["recall"] for x in rows if x["queries"]==qs]
        b=[x["bytes_per_key"] for x in rows if x["queries"]==qs]
        print(f"{name:14s} {qs} heads {len(r)} mean {st.mean(r):.4f} min {min(r):.4f} bytes/key {b[0]:.1f}")
