#!/usr/bin/env bash
# Call d1: binary new = main (fbe6a28) + the warpgroup (wgmma) flash kernel `flash_prefill_d128_k64_m1_w`
# and its layout probe `_x` (V's descriptor strides swapped); main = fbe6a28.
# gpu-check's kernel checks and the flash timings on new; the 8B Q4_K_M end to end (greedy, hashes);
# prefill A B B A against main: pp512, pp4096 at 512- and 4096-row micro-batches.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in new main; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/new
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 240 $B gpu-check --bench-flash > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "flash" $OUT/kernels.md | cut -c1-200 | tee -a $S
tail -3 $W/kernels.err | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf
# Compile main's kernels too (its flash.cu differs), outside the timed runs.
timeout 60 $W/bin/main bench -m $M --device cuda -r 1 -p 16 -n 1 > /dev/null 2>&1
run() { local l=$1 bin=$2 tag=$3; shift 3; echo "== $l $tag $(el)" >> $R; timeout 150 $W/bin/$bin bench -m $M --device cuda -r 3 --output-format json "$@" 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_") + "_" + sys.argv[2], round(r["tok_s"],1))' $l $tag | tee -a $R; }
for b in new main main new; do run $b $b ub4096 -p 512,4096 -n 0 --ubatch 4096; run $b $b ub512 -p 4096 -n 0 --ubatch 512; done
tail -3 $W/bench.err | tee -a $S
[ $(( $(date +%s)-T0 )) -lt 420 ] && { timeout 200 $B gpu-check -m $M --hash-prompt 600 > $OUT/check.md 2>$W/check.err
  echo "gpu-check 8B: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
  grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "greedy\|sha256" $OUT/check.md | cut -c1-230 | tee -a $S; }
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
print("| test | new | main | new / main | new runs | main runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}):
    n, m = v.get(("new", t), []), v.get(("main", t), [])
    if not n or not m: continue
    a, b = statistics.median(n), statistics.median(m)
    print(f"| {t} | {a:.0f} | {b:.0f} | {a/b:.3f}x | {' / '.join('%.0f' % x for x in n)} | {' / '.join('%.0f' % x for x in m)} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
