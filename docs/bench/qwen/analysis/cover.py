import numpy as np, sys, json
dump=sys.argv[1]; layers=[int(x) for x in sys.argv[2].split(',')]
m=json.load(open(dump+'/manifest.json')); g=m['n_q_heads']//m['n_kv_heads']
for L in layers:
    K=np.load(f'{dump}/layer{L:02d}.k.npy').astype(np.float32)
    Q=np.load(f'{dump}/layer{L:02d}.q.npy').astype(np.float32)
    QD=np.load(f'{dump}/layer{L:02d}.qdec.npy').astype(np.float32)
    n=K.shape[1]
    for kv in range(K.shape[0]):
        k=K[kv]
        # causal top-100 of prefill queries (every 4th query to save time), pooled over the group
        listed=np.zeros(n,bool)
        for j in range(g):
            q=Q[kv*g+j][::4]
            pos=np.arange(0,n,4)
            s=q@k.T
            s[np.arange(n)[None,:]>pos[:,None]]=-np.inf
            top=np.argpartition(-s,100,axis=1)[:,:100]
            listed[top.ravel()]=True
        for j in range(g):
            h=kv*g+j; qd=QD[h]; s=qd@k.T
            top=np.argpartition(-s,100,axis=1)[:,:100]
            cov=listed[top].mean(); recent=(top>=n-512).mean()
            print(f'L{L:02d} h{h:2d}: decode top-100 keys listed by a prefill query {cov:.2f}, in the last 512 {recent:.2f}, keys listed {listed.mean():.2f}')
