"""Share of far-looking causal lists per KV group and head (pass 5, section 4).

For prefill positions 4096, 4209, ... of each query head, the causal top-100 keys, and the share
of them within 1,024 positions of the query. A row is far-looking when that share is below 0.1
(what `global-full=0.1` unmasks). Paths are the dumps of sections 2 and 3.
usage: python3 far_share.py
"""
import numpy as np, sys
W=1024
def run(dump, L, group):
    q=np.load('%s/layer%02d.q.npy'%(dump,L)); K=np.load('%s/layer%02d.k.npy'%(dump,L))
    n=K.shape[1]
    for kv in range(K.shape[0]):
        k=K[kv].astype(np.float32)
        pos=np.arange(4096,n,113)
        per=[]
        for h in range(kv*group,(kv+1)*group):
            qp=q[h,pos].astype(np.float32)
            s=qp@k.T
            s[np.arange(n)[None,:]>pos[:,None]]=-np.inf
            top=np.argpartition(-s,100,axis=1)[:,:100]
            fr=((pos[:,None]-top)<W).mean(axis=1)
            per.append(fr)
        allfr=np.concatenate(per)
        print(dump.split('/')[-1],'L%d kv%d'%(L,kv),'group share<0.1 %.3f'%((allfr<0.1).mean()),'median near %.2f'%np.median(allfr),'| per head share<0.1:',' '.join('%.2f'%((f<0.1).mean()) for f in per))
for L in (5,11,17): run('../runs/gemma3-32k',L,4)
run('../runs/smollm2-32k-rs4',16,3)
