set -u
B=target/release/qkindex
for m in gemma3-270m smollm2-135m; do for n in 2048 8188; do
  l=17; [ $m = smollm2-135m ] && l=9
  /usr/bin/time -v $B dump --model $m --text $TMPDIR/licenses-all.txt --prefix $n --layers $l --decode 4 --out $TMPDIR/q-$m-$n > $TMPDIR/q-$m-$n.log 2>&1
  echo "$m $n: $(grep -E '^prefill:|^decode:' $TMPDIR/q-$m-$n.log | tr '\n' ' ') rss_kb=$(grep 'Maximum resident' $TMPDIR/q-$m-$n.log | awk '{print $NF}')"
done; done
$B demo --index attention:queries-per-key=1,prune-cands=128 --out $TMPDIR/demo-cheap > $TMPDIR/demo-cheap.log 2>&1
echo "demo cheap: $(grep -E 'time to first token' $TMPDIR/demo-cheap.log)"
$B demo --out $TMPDIR/demo-default > $TMPDIR/demo-default.log 2>&1
echo "demo default: $(grep -E 'time to first token' $TMPDIR/demo-default.log)"
