import json, sys, collections, statistics as st
# usage: summ.py bench.json faiss.jsonl target
bench=json.load(open(sys.argv[1])); target=float(sys.argv[3])
best=collections.defaultdict(dict)  # variant -> head -> (qps, scanned)
for r in bench['rows']:
    if r['queries']!='q2k' or r['recall']<target: continue
    v=(r['impl'],r['index']+(':'+r['variant'] if r['variant'] else ''))
    h=(r['layer'],r['head'])
    cur=best[v].get(h)
    if cur is None or r['qps']>cur[0]: best[v][h]=(r['qps'],r.get('scanned'),r.get('bytes_per_key'))
for line in open(sys.argv[2]):
    r=json.loads(line)
    if r['recall']<target: continue
    v=('faiss',r['index']+('' if r['index']!='ivf-pq-fastscan' else ':refine=%d'%r['params']['refine']))
    h=(r['layer'],r['head'])
    cur=best[v].get(h)
    if cur is None or r['qps']>cur[0]: best[v][h]=(r['qps'],None,r['bytes_per_key'])
heads=sorted({h for v in best.values() for h in v} | {(r['layer'],r['head']) for r in bench['rows']})
print(f"recall@100 >= {target}, q2k, {len(heads)} heads")
print("| impl | index | heads reaching | median best QPS | median scanned (full precision) | bytes/key |")
print("|---|---|---|---|---|---|")
for v,hs in sorted(best.items()):
    q=[x[0] for x in hs.values()]; s=[x[1] for x in hs.values() if x[1] is not None]; b=[x[2] for x in hs.values() if x[2] is not None]
    print(f"| {v[0]} | {v[1]} | {len(hs)}/{len(heads)} | {st.median(q):.0f} | {st.median(s) if s else float('nan'):.4f} | {st.median(b) if b else float('nan'):.1f} |")
