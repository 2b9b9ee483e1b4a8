#!/usr/bin/env bash
# Call e7: binary e7 = e6 + the tensor-core batch kernel (`qmma_q4_k`) issuing its first weight
# loads before its wait. Kernel checks (e7); 8B Q4_K_M decode batches of 4, 6 and 8 sequences
# (`-p 0 -n 32 -d 128`, where load-time timing sends Q4_K matrices to qmma), e7 e6 e6 e7.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in e7 e6; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
( $W/bin/e7 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 150 $W/bin/e7 gpu-check > $OUT/kernels-e7.md 2>$W/kernels.err
echo "kernel checks e7: exit $?, $(grep -c '| yes |' $OUT/kernels-e7.md) yes, $(grep -c '| NO |' $OUT/kernels-e7.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels-e7.md | cut -c1-300 | tee -a $S; grep -i "qmma" $OUT/kernels-e7.md | head -4 | cut -c1-200 | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
run() { local b=$1; echo "== $b $(el)" >> $R; timeout 100 $W/bin/$b bench -m $W/q4.gguf --device cuda -r 2 --output-format json -p 0 -n 32 -d 128 --parallel 4,6,8 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $b | tee -a $R; }
for b in e7 e6 e6 e7; do run $b; done
tail -2 $W/bench.err | tee -a $S
timeout 60 $W/bin/e7 bench -m $W/q4.gguf --device cuda -v -r 1 -p 0 -n 1 --parallel 4 2>&1 | grep -i "qmma\|route" | head -8 > $OUT/routes.txt
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="): v[(f[0], f[1])].append(float(f[2]))
print("| test | e7 | e6 | e7 / e6 | e7 runs | e6 runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}):
    n, m = v[("e7", t)], v[("e6", t)]
    print(f"| {t} | {statistics.median(n):.0f} | {statistics.median(m):.0f} | {statistics.median(n) / statistics.median(m):.3f}x | {' / '.join('%.0f' % x for x in n)} | {' / '.join('%.0f' % x for x in m)} |")
PY
echo "all done $(el)"
