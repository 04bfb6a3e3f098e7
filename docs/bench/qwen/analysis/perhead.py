import json, sys, numpy as np
d=json.load(open(sys.argv[1]+'/bench.json'))
dump=sys.argv[2]
best={}
for r in d['rows']:
    if r['index']!='attention' or r['k']!=100: continue
    key=(r['layer'],r['head'])
    if r['recall']>=0.95:
        best[key]=min(best.get(key,9),r['scanned'])
m=json.load(open(dump+'/manifest.json')); g=m['n_q_heads']//m['n_kv_heads']
out=[]
for (L,h),s in sorted(best.items()):
    k=np.load(f'{dump}/layer{L:02d}.k.npy').astype(np.float32)[h//g]
    q=np.load(f'{dump}/layer{L:02d}.qdec.npy').astype(np.float32)[h]
    qp=np.load(f'{dump}/layer{L:02d}.q.npy').astype(np.float32)[h]
    sc=q@k.T/np.sqrt(k.shape[1]); sc-=sc.max(1,keepdims=True); p=np.exp(sc); p/=p.sum(1,keepdims=True)
    mass=np.sort(p,1)[:,-100:].sum(1).mean()
    # gap: score of rank 1 vs rank 100 relative to std
    raw=q@k.T; srt=np.sort(raw,1)
    gap=((srt[:,-1]-srt[:,-100])/raw.std(1)).mean()
    # OOD: cosine between decode queries mean and prefill queries mean direction
    cq=np.dot(q.mean(0),qp.mean(0))/np.linalg.norm(q.mean(0))/np.linalg.norm(qp.mean(0))
    out.append((L,h,s,mass,gap,cq))
    print(f'L{L:02d} h{h:2d} scanned@0.95 {s:.3f}  top100 mass {mass:.2f}  (top1-top100)/std {gap:.2f}  cos(mean qdec, mean qprefill) {cq:.2f}')
a=np.array([o[2:] for o in out])
print('corr scanned~mass', np.corrcoef(a[:,0],a[:,1])[0,1], ' scanned~gap', np.corrcoef(a[:,0],a[:,2])[0,1], ' scanned~cos', np.corrcoef(a[:,0],a[:,3])[0,1])
