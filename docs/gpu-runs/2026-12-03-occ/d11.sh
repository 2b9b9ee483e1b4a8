#!/usr/bin/env bash
# Call d11 (the occ session): binary d11 = d10 (main 9d6749a) with dqmma's one-n-tile form keeping two
# super-blocks of weights in flight in registers (three sets, 148 registers, three blocks a
# multiprocessor; the same products, so the same bits). Every kernel check with d11 (both models
# written meanwhile); the 8B at 2-8 sequences d11 d10 d10 d11; gemma3-270m at 4-64 sequences d10
# base base d10 (base = c47320a, before the kernel landed).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt; R=$OUT/results.txt
for b in d11 d10 base; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/d11
( $B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/gemma3-270m.gguf > $W/synth.log 2>&1
  $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf >> $W/synth.log 2>&1 ) &
SYN=$!
timeout 200 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S; grep -i "dqmma" $OUT/kernels.md | cut -c1-400 | tee -a $S
wait $SYN; tail -2 $W/synth.log; echo "synth done $(el)" | tee -a $S
run() { local l=$1 m=$2 p=$3; echo "== $l $m $(el)" >> $R; timeout 100 $W/bin/$l bench -m $W/$m.gguf --device cuda -r 2 --output-format json -p 0 -n 32 -d 128 --parallel $p 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], sys.argv[2], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l $m | tee -a $R; }
if grep -q "^| dqmma .*| yes |$" $OUT/kernels.md; then
  for l in d11 d10 d10 d11; do run $l q4 2,4,6,8; done
else echo "dqmma check did not pass: no d11 runs" | tee -a $S; fi
for l in d10 base base d10; do run $l gemma3-270m 4,8,16,32,64; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4 and not line.startswith("=="):
        v[(f[0], f[1], f[2])].append(float(f[3]))
for m, a, b in [("q4", "d11", "d10"), ("gemma3-270m", "d10", "base")]:
    print(f"| {m} test | {a} | {b} | ratio | {a} runs | {b} runs |"); print("|---|---:|---:|---:|---|---|")
    for t in sorted({k[2] for k in v if k[1] == m}, key=lambda s: (len(s), s)):
        x, y = v.get((a, m, t), []), v.get((b, m, t), [])
        if x and y:
            p, q = statistics.median(x), statistics.median(y)
            print(f"| {t} | {p:.0f} | {q:.0f} | {p/q:.3f}x | {' / '.join('%.0f' % z for z in x)} | {' / '.join('%.0f' % z for z in y)} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
