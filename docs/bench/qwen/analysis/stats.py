import numpy as np, sys, json
def stats(d, layers, label):
    m=json.load(open(d+'/manifest.json')); g=m['n_q_heads']//m['n_kv_heads']
    for L in layers:
        k=np.load(f'{d}/layer{L:02d}.k.npy').astype(np.float32)  # [kv, n, hd]?
        q=np.load(f'{d}/layer{L:02d}.qdec.npy').astype(np.float32)
        if L==layers[0]: print(label,'k',k.shape,'qdec',q.shape)
        for h in range(k.shape[0]):
            K=k[h]; mu=K.mean(0); off=np.linalg.norm(mu)/np.linalg.norm(K,axis=1).mean()
            # cosine between keys: mean pairwise cosine via normalized mean
            Kn=K/np.linalg.norm(K,axis=1,keepdims=True); mc=np.linalg.norm(Kn.mean(0))**2
            # attention flatness: for decode queries of the group, top-100 softmax mass
            masses=[];ent=[]
            for j in range(g):
                Q=q[h*g+j]
                s=Q@K.T/np.sqrt(K.shape[1]); s-=s.max(1,keepdims=True); p=np.exp(s); p/=p.sum(1,keepdims=True)
                masses.append(np.sort(p,1)[:,-100:].sum(1).mean())
            print(f'{label} L{L:02d} kv{h}: |mean k|/mean|k| {off:.3f}  mean cos(k,k) {mc:.3f}  top100 mass {np.mean(masses):.3f} (heads {" ".join(f"{x:.2f}" for x in masses)})')
stats(sys.argv[1], [int(x) for x in sys.argv[2].split(',')], sys.argv[3])
