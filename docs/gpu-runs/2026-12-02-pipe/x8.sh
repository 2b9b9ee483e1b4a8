#!/usr/bin/env bash
# Call x8: binary x8 = x6 with the pipelined qmma offered past 8 rows only to gate and up (x6 also
# routed q, k and o there, which takes q, k and v off the stacked GEMM whose products one launch cuts,
# rotates and stores); base = main before (5df36a5). Routes chosen (-v), then batched decode
# x8 base base x8 x8 base.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt; R=$OUT/results.txt
for b in x8 base; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/x8
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
echo "synth $(el)" | tee -a $S
timeout 60 $B bench -m $W/q4.gguf --device cuda -v -p 0 -n 1 -r 1 > $OUT/routes.txt 2>&1
grep -i "batches" $OUT/routes.txt | cut -c1-250 | sort | uniq -c | sort -rn | head -12 | tee -a $S
run() { local l=$1; echo "== $l $(el)" >> $R; timeout 120 $W/bin/$l bench -m $W/q4.gguf --device cuda -r 2 --output-format json -p 0 -n 32 -d 128 --parallel 1,4,8,12,16 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), r.get("parallel", r.get("n_seq", "")), round(r["tok_s"],1))' $l | tee -a $R; }
for l in x8 base base x8 x8 base; do run $l; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 3 and not line.startswith("=="):
        try: v[(f[0], " ".join(f[1:-1]))].append(float(f[-1]))
        except ValueError: pass
print("| 8B Q4_K_M test | x8 | base | ratio | x8 runs | base runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}, key=lambda s: (len(s), s)):
    n, m = v.get(("x8", t), []), v.get(("base", t), [])
    if not n or not m: continue
    a, b = statistics.median(n), statistics.median(m)
    print(f"| {t} | {a:.0f} | {b:.0f} | {a/b:.3f}x | {' / '.join('%.0f' % x for x in n)} | {' / '.join('%.0f' % x for x in m)} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
