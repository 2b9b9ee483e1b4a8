#!/usr/bin/env bash
# Call c3: binary c3 = c2's new2 with the ahead kernels' names registered (c2's ahead runs found no
# `mmvqpa*` kernel). The full benchmark: scripts/gpu_bench.sh's prepare phase (the synthetic 8B
# files, gpu-check on gemma3-270m and the 8B Q4_K_M, llama-bench unpacked from c1's build) and its
# bench phase on the three 8B files (pp4096 at 512- and 4096-row micro-batches). Then the ahead
# kernels: kernel checks and `--bench-qmma` with TANDEM_CUDA_BATCH_AHEAD=1, tg32 @ d128 at 1-8
# sequences on the 8B Q4_K_M ahead, plain, plain, ahead. Last the Gemma-3-27B-shaped Q4_K_M written
# and benched (pp4096 at 4096-row micro-batches), time allowing.
T0=$(date +%s); el() { echo "$(( $(date +%s)-T0 )) s"; }
W=/tmp/fb; mkdir -p $W/bin; gunzip -c .gpu/f/tandem-c3.gz > $W/bin/c3; chmod +x $W/bin/c3; B=$W/bin/c3
export TANDEM=$B WORK=$W LLAMA_PREBUILT=.gpu/llama-build CHECK_8B=1 S=$OUT/summary.txt
PP_UBATCH="512 4096" PHASE=prepare bash scripts/gpu_bench.sh > $W/prepare.log 2>&1
cp $W/check.md $OUT/check.md
echo "prepare $(el): $(grep -c '| yes |' $W/check.md) yes, $(grep -c '| NO |' $W/check.md) NO; $(grep 'exit' $W/prepare.log | tr '\n' ' ')" | tee -a $S
grep "| NO |" $W/check.md | cut -c1-300 | tee -a $S; grep "sha256\|greedy" $W/check.md | cut -c1-200 | tee -a $S
PP_UBATCH="512 4096" PHASE=bench bash scripts/gpu_bench.sh > $OUT/bench-8b.log 2>&1
echo "8B bench $(el)" | tee -a $S; tail -16 $OUT/bench-8b.log | tee -a $S
source scripts/gpu_env.sh >/dev/null; export TANDEM_KERNEL_CACHE=$W/kernels
TANDEM_CUDA_BATCH_AHEAD=1 timeout 150 $B gpu-check --bench-qmma > $OUT/check-ahead1.md 2>$W/check-ahead.err
echo "kernel checks, ahead: exit $?, $(grep -c '| yes |' $OUT/check-ahead1.md) yes, $(grep -c '| NO |' $OUT/check-ahead1.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check-ahead1.md | cut -c1-300 | tee -a $S; tail -2 $W/check-ahead.err | tee -a $S
M=$W/llama3-8b-q4_k_m.gguf; X=$OUT/extra.txt; R=$OUT/results.txt
for a in 1 0; do echo "== decode choices: ahead=$a" >> $X
  TANDEM_CUDA_BATCH_AHEAD=$a timeout 100 $B bench -m $M --device cuda -v -r 1 -p 0 -n 1 2>&1 | grep -i "decode kernel" >> $X; done
run() { local l=$1; shift; echo "== $l $(el)" >> $R; env "$@" timeout 150 $B bench -m $M --device cuda -r 3 --output-format json -p 0 -n 32 -d 128 --parallel 1,2,3,4,6,8 2>>$W/bench2.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], "q4_" + r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l | tee -a $R; }
run ahead TANDEM_CUDA_BATCH_AHEAD=1; run plain; run plain; run ahead TANDEM_CUDA_BATCH_AHEAD=1
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3:
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
print("| test | ahead | plain | ahead / plain | ahead runs | plain runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}, key=lambda t: int(t.split("_x")[1]) if "_x" in t else 1):
    a, p = v[("ahead", t)], v[("plain", t)]
    print(f"| {t} | {statistics.median(a):.0f} | {statistics.median(p):.0f} | {statistics.median(a) / statistics.median(p):.2f}x | {' / '.join('%.0f' % x for x in a)} | {' / '.join('%.0f' % x for x in p)} |")
PY
echo "ahead runs $(el)" | tee -a $S
grep "batch speed" $OUT/check-ahead1.md | cut -c1-260 >> $S
if [ $(( $(date +%s)-T0 )) -lt 400 ]; then
  timeout 200 $B synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/gemma3-27b-q4_k_m.gguf 2>&1 | tail -1
  echo "27B written $(el)" | tee -a $S
  timeout $(( 585 - ($(date +%s)-T0) )) env QUANTS="" GEMMA27=1 PP_UBATCH="4096" PHASE=bench bash scripts/gpu_bench.sh > $OUT/bench-27b.log 2>&1
  echo "27B bench $(el)" | tee -a $S; tail -6 $OUT/bench-27b.log | tee -a $S
fi
tar -czf $OUT/json.tgz -C $W $(cd $W && ls tandem-*.json llama-*.json 2>/dev/null)
echo "===== summary"; cat $S
