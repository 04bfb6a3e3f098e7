import numpy as np, json, sys
def load(d, L):
    k=np.load(f"{d}/layer{L:02d}.k.npy").astype(np.float32); q=np.load(f"{d}/layer{L:02d}.qdec.npy").astype(np.float32)
    kd=np.load(f"{d}/layer{L:02d}.kdec.npy").astype(np.float32)
    return k,q,kd
def topk(Q,K,k=100): 
    s=Q@K.T; return np.argpartition(-s,k,axis=1)[:,:k]
def rec(a,b): return np.mean([len(set(x)&set(y))/len(x) for x,y in zip(a,b)])
def perkey(K):
    s=np.abs(K).max(1,keepdims=True)/127; return np.clip(np.round(K/s),-127,127)*s
def perdim(K):
    s=np.abs(K).max(0,keepdims=True)/127; return np.clip(np.round(K/s),-127,127)*s
def affine(K):
    lo=K.min(0,keepdims=True); hi=K.max(0,keepdims=True); s=(hi-lo)/254; o=(hi+lo)/2
    return np.clip(np.round((K-o)/s),-127,127)*s+o
def both(K):
    ds=np.abs(K).max(0,keepdims=True); X=K/ds; s=np.abs(X).max(1,keepdims=True)/127
    return np.clip(np.round(X/s),-127,127)*s*ds
def affkey(K):
    lo=K.min(0,keepdims=True); hi=K.max(0,keepdims=True); o=(hi+lo)/2; r=np.maximum((hi-lo)/2,1e-30)
    X=(K-o)/r; s=np.abs(X).max(1,keepdims=True)/127
    return np.clip(np.round(X/s),-127,127)*s*r+o
def f16(K): return K.astype(np.float16).astype(np.float32)
d=sys.argv[1]; m=json.load(open(d+"/manifest.json")); g=m['n_q_heads']//m['n_kv_heads']
Ls=[int(x) for x in sys.argv[2].split(',')] if len(sys.argv)>2 else m['layers']
res={}
for L in Ls:
    k,q,kd=load(d,L)
    for h in range(q.shape[0]):
        K=k[h//g]; 
        for qs,Q in (("q2k",q[h]),("k2k",kd[h//g])):
            t=topk(Q,K)
            for name,f in (("f16",f16),("perkey",perkey),("perdim",perdim),("affine",affine),("perdim*perkey",both),("affine*perkey",affkey)):
                res.setdefault((qs,name),[]).append(rec(topk(Q,f(K)),t))
for k,v in sorted(res.items()): print(k, "mean %.4f min %.4f"%(np.mean(v),np.min(v)), len(v))
