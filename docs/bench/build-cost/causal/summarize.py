import json,sys,collections
d=json.load(open(sys.argv[1]))
acc=collections.defaultdict(lambda: collections.defaultdict(list)); builds=collections.defaultdict(dict)
for r in d['rows']:
    v=r['variant'] or 'default'; ef=r['params'].get('ef')
    acc[v][ef].append((r['recall'],r['distance_computations']))
    builds[v][(r['layer'],r['head']//3)]=r['build_s']
for v in acc:
    b=builds[v].values(); tot=sum(x['total'] for x in b); knn=sum(x['knn'] for x in b); pr=sum(x['projection'] for x in b)
    s=' '.join('ef%d rec %.4f dc %.0f'%(ef, sum(a for a,_ in xs)/len(xs), sum(c for _,c in xs)/len(xs)) for ef,xs in sorted(acc[v].items()))
    print(f'{v:45s} build {tot:6.2f}s (knn {knn:5.2f} proj {pr:5.2f}, {len(b)} idx) | {s}')
