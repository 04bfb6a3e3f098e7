"""Issue 26: does a random-sign Hadamard rotation before int8 coding lower the recall cost of int8
key storage? Flat scan recall@100 (q2k) of each coding against the exact f32 top-100, every
head of a dump. usage: python3 rotation.py DUMP [layers]"""
import numpy as np, json, sys
def load(d, L):
    k=np.load(f"{d}/layer{L:02d}.k.npy").astype(np.float32); q=np.load(f"{d}/layer{L:02d}.qdec.npy").astype(np.float32)
    return k,q
def topk(Q,K,k=100):
    s=Q@K.T; return np.argpartition(-s,k,axis=1)[:,:k]
def rec(a,b): return np.mean([len(set(x)&set(y))/len(x) for x,y in zip(a,b)])
def affkey(K):
    lo=K.min(0,keepdims=True); hi=K.max(0,keepdims=True); o=(hi+lo)/2; r=np.maximum((hi-lo)/2,1e-30)
    X=(K-o)/r; s=np.abs(X).max(1,keepdims=True)/127
    return np.clip(np.round(X/s),-127,127)*s*r+o
def perkey(K):
    s=np.abs(K).max(1,keepdims=True)/127; return np.clip(np.round(K/s),-127,127)*s
def hadamard(d):
    H=np.array([[1.0]])
    while H.shape[0]<d: H=np.block([[H,H],[H,-H]])
    return H/np.sqrt(d)
rng=np.random.default_rng(0)
def rot(K,kind):
    d=K.shape[1]
    if kind=="had": R=hadamard(d)*rng.choice([-1,1],size=d)[None,:]
    else: R,_=np.linalg.qr(rng.standard_normal((d,d)))
    return R
def rot_perkey(K):
    R=rot(K,"had"); mu=K.mean(0,keepdims=True); X=(K-mu)@R
    return perkey(X)@R.T+mu
def rot_affkey(K):
    R=rot(K,"had"); mu=K.mean(0,keepdims=True); X=(K-mu)@R
    return affkey(X)@R.T+mu
def mean_perkey(K):
    mu=K.mean(0,keepdims=True); return perkey(K-mu)+mu
def rot_perkey_mse(K):
    # rotate, per-key scale with clipping at 0.9 max
    R=rot(K,"had"); mu=K.mean(0,keepdims=True); X=(K-mu)@R
    best=None
    s0=np.abs(X).max(1,keepdims=True)/127
    errs=[];outs=[]
    for c in (1.0,0.9,0.8,0.7):
        s=s0*c; Y=np.clip(np.round(X/s),-127,127)*s; outs.append(Y); errs.append(((Y-X)**2).sum(1))
    errs=np.stack(errs); idx=errs.argmin(0)
    Y=np.stack(outs)[idx,np.arange(X.shape[0])]
    return Y@R.T+mu
def f16(K): return K.astype(np.float16).astype(np.float32)
d=sys.argv[1]; m=json.load(open(d+"/manifest.json")); g=m['n_q_heads']//m['n_kv_heads']
Ls=[int(x) for x in sys.argv[2].split(',')] if len(sys.argv)>2 else m['layers']
res={}
for L in Ls:
    k,q=load(d,L)
    for h in range(q.shape[0]):
        K=k[h//g]; Q=q[h]
        t=topk(Q,K)
        for name,f in (("f16",f16),("affine*perkey",affkey),("mean-perkey",mean_perkey),("had-perkey",rot_perkey),("had-affkey",rot_affkey),("had-perkey-mse",rot_perkey_mse)):
            res.setdefault(name,[]).append(rec(topk(Q,f(K)),t))
for k,v in res.items(): print(k, "mean %.4f min %.4f"%(np.mean(v),np.min(v)), len(v))
