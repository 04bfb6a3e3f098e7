import json,statistics as st,sys
for name in sys.argv[1:]:
    rows=json.load(open(f"{name}.bench.json"))["rows"]
    for qs in sorted({r["queries"] for r in rows}):
        efs=sorted({r["params"].get("ef") for r in rows if r["index"]=="attention"})
        line=[]
        for ef in efs:
            rr=[r["recall"] for r in rows if r["params"].get("ef")==ef and r["queries"]==qs]
            line.append(f"{ef}:{st.mean(rr):.4f}")
        print(f"{name:10s} {qs}", " ".join(line))
