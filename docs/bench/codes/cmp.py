import json, sys, statistics as st
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
key=lambda r:(r['index'],r['variant'],r['layer'],r['head'],r['queries'],json.dumps(r['params'],sort_keys=True),r.get('k',100))
A={key(r):r for r in a['rows']}; B={key(r):r for r in b['rows']}
by={}
for k,r in A.items():
    if k in B:
        by.setdefault((k[0],k[1],k[4],k[5]),[]).append(r['recall']-B[k]['recall'])
print("index variant queries params | heads | mean recall(f16)-recall(i8) | max")
for k,v in sorted(by.items()):
    print(k, len(v), "%.4f"%(sum(v)/len(v)), "%.4f"%max(v))
