#!/bin/bash
# A/B of two qkindex binaries on the same cached indexes (CACHE, built by the first run), interleaved: base, new, base, new.
# usage (repository root): bash docs/bench/codes/avx2/ab/ab.sh BASE_BINARY NEW_BINARY OUT_DIR
B=$1; N=$2; O=$3; mkdir -p $O
for i in 1 2; do
for w in base new; do
  bin=$B; [ $w = new ] && bin=$N
  $bin bench --dump ../shared/data/smollm2-public-8k --layers 2,16,29 --heads 0,4,8 --kinds attention --queries q2k --ef 100,160,256 --repeat 40 --latency-samples 0 --clock thread-cpu --cache ${CACHE:-ab-cache} --out $O/$w$i > $O/$w$i.log 2>&1
done; done
python3 - $O <<'P'
import json,sys,statistics as st
O=sys.argv[1]
def load(n): return {(r['layer'],r['head'],json.dumps(r['params'],sort_keys=True)):r for r in json.load(open(f"{O}/{n}/bench.json"))['rows'] if r['index']=='attention'}
b=[load('base1'),load('base2')]; n=[load('new1'),load('new2')]
ratios=[];diff=0
for k in b[0]:
    qb=st.median([x[k]['qps'] for x in b]); qn=st.median([x[k]['qps'] for x in n])
    ratios.append(qn/qb)
    if b[0][k]['recall']!=n[0][k]['recall'] or b[0][k]['distance_computations']!=n[0][k]['distance_computations']: diff+=1
print(f"rows {len(ratios)}, rows with different recall/products {diff}, median QPS ratio new/base {st.median(ratios):.3f} (min {min(ratios):.3f} max {max(ratios):.3f})")
P
