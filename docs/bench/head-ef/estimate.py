import json,re,sys
bench,log,variant=sys.argv[1],sys.argv[2],sys.argv[3]
group=int(sys.argv[4])
rep=json.load(open(bench))
rows=[r for r in rep['rows'] if r['index']=='attention' and r['variant']==variant and r['queries']=='q2k' and 'beam' not in r['params']]
by={}
for r in rows: by.setdefault((r['layer'],r['head']),[]).append((r['params']['ef'],r['scanned'],r['recall']))
efs={}
for m in re.finditer(r"layer (\d+) head (\d+) attention:(\S+): built.*?per query head ([0-9/]+)", open(log).read()):
    if m.group(3)!=variant: continue
    L,h=int(m.group(1)),int(m.group(2)); kv=h//group
    efs[(L,kv)]=[int(x) for x in m.group(4).split('/')]
def at(key,ef):
    pts=sorted(by[key])
    if ef<=pts[0][0]: return pts[0][1:]
    for (e0,s0,r0),(e1,s1,r1) in zip(pts,pts[1:]):
        if e0<=ef<=e1:
            t=(ef-e0)/(e1-e0) if e1>e0 else 0; return s0+t*(s1-s0), r0+t*(r1-r0)
    return pts[-1][1:]
G=[];H=[];n=0
for (L,h) in sorted(by):
    e=efs.get((L,h//group))
    if not e: continue
    g=at((L,h),max(e)); hh=at((L,h),e[h%group]); G.append(g); H.append(hh); n+=1
print(f"{n} heads: mean scanned at the group's ef {sum(x[0] for x in G)/n:.4f}, at each head's ef {sum(x[0] for x in H)/n:.4f} (ratio {sum(x[0] for x in H)/sum(x[0] for x in G):.3f}); mean recall {sum(x[1] for x in G)/n:.4f} -> {sum(x[1] for x in H)/n:.4f}; heads below 0.95: {sum(x[1]<0.95 for x in G)} -> {sum(x[1]<0.95 for x in H)}")
