#!/usr/bin/env bash
# Call c5: binary hot = c2's with the batch routes timed with their input made just before (in L2,
# as in a step) and only the product timed; c2 = c2's binary. tg32 @ d128 at 1-8 sequences on the 8B
# Q4_K_M and gemma3-270m: hot, c2, c2, hot, and c2 --deterministic on the 8B; --verbose's routes.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt; X=$OUT/extra.txt
for b in hot c2; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/hot
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; G=$W/g.gguf
for m in $M $G; do echo "== $(basename $m) decode choices" >> $X; timeout 100 $B bench -m $m --device cuda -v -r 1 -p 0 -n 1 2>&1 | grep -i "decode kernel" >> $X; done
run() { local l=$1 bin=$2 m=$3; shift 3; echo "== $l $(el)" >> $R; timeout 150 $W/bin/$bin bench -m $m --device cuda -r 3 --output-format json $ARGS "$@" 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], sys.argv[2] + "_" + r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l $(basename $m .gguf) | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,3,4,6,8"
run det c2 $M --deterministic
for m in $M $G; do run hot hot $m; run c2 c2 $m; run c2 c2 $m; run hot hot $m; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3:
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["hot", "c2", "det"]
print("| test | " + " | ".join(cols) + " | hot / c2 | hot runs | c2 runs |")
print("|---|" + "---:|" * (len(cols) + 1) + "---|---|")
def key(t): return (t.split("_tg")[0], int(t.split("_x")[1]) if "_x" in t else 1)
for t in sorted({k[1] for k in v}, key=key):
    med = {c: statistics.median(v[(c, t)]) if v.get((c, t)) else None for c in cols}
    f = lambda x: "-" if x is None else "%.0f" % x
    j = lambda c: " / ".join(f(x) for x in v.get((c, t), []))
    print(f"| {t} | " + " | ".join(f(med[c]) for c in cols) + f" | {med['hot'] / med['c2']:.2f}x | {j('hot')} | {j('c2')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S; cat $X
