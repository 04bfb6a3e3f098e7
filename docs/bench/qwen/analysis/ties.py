import numpy as np, sys, json
dump=sys.argv[1]; spec=sys.argv[2:]
m=json.load(open(dump+'/manifest.json')); g=m['n_q_heads']//m['n_kv_heads']
ids=np.load(dump+'/prompt_ids.npy')
for s in spec:
    L,h=map(int,s.split(':'))
    K=np.load(f'{dump}/layer{L:02d}.k.npy').astype(np.float32)[h//g]
    QD=np.load(f'{dump}/layer{L:02d}.qdec.npy').astype(np.float32)[h]
    sc=QD@K.T/np.sqrt(K.shape[1])
    srt=-np.sort(-sc,1)
    ranks=[0,9,49,99,149,199,399,999]
    rel=(srt[:,ranks]-srt[:,[99]]).mean(0)
    # distinct tokens among top-100
    top=np.argsort(-sc,1)[:,:100]
    distinct=np.mean([len(set(ids[t].tolist())) for t in top])
    # how many keys within 0.1 (logit units) of the 100th score
    near=((sc>=srt[:,[99]]-0.1)&(sc<=srt[:,[99]]+0.1)).sum(1).mean()
    print(f'L{L:02d} h{h:2d}: score - score@100 at ranks 1,10,50,100,150,200,400,1000: {" ".join(f"{x:+.2f}" for x in rel)} | distinct tokens in top-100 {distinct:.0f} | keys within ±0.1 of the 100th {near:.0f}')
