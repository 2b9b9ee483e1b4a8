#!/usr/bin/env bash
# Call w2: the full table with binary w1 (main + F16 stacking + serve warm-up). `scripts/gpu_bench.sh`:
# prepare (the three synthetic 8B files, kernel checks, gemma3-270m end to end; llama-bench from
# call w1's build, still on this machine), bench on the three 8B files (pp4096 at 512- and 4096-row
# micro-batches), A B B A; then the Gemma-3-27B-shaped Q4_K_M written and benched the same way.
T0=$(date +%s); el() { echo "$(( $(date +%s)-T0 )) s"; }
W=/tmp/t; mkdir -p $W/bin; B=$W/bin/w1; [ -x $B ] || { gunzip -c .gpu/f/tandem-w1.gz > $B; chmod +x $B; }
export TANDEM=$B WORK=$W S=$OUT/summary.txt
ls $W/lcb/bin/llama-bench >/dev/null 2>&1 && echo "llama-bench from w1: yes" | tee -a $S
PP_UBATCH="512 4096" PHASE=prepare bash scripts/gpu_bench.sh > $W/prepare.log 2>&1
cp $W/check.md $OUT/check.md
echo "prepare $(el): $(grep -c '| yes |' $W/check.md) yes, $(grep -c '| NO |' $W/check.md) NO; $(grep 'exit' $W/prepare.log | tr '\n' ' ')" | tee -a $S
grep "| NO |" $W/check.md | cut -c1-300 | tee -a $S; grep "sha256\|greedy" $W/check.md | cut -c1-200 | tee -a $S
PP_UBATCH="512 4096" PHASE=bench timeout $(( 560 - ($(date +%s)-T0) )) bash scripts/gpu_bench.sh > $OUT/bench-8b.log 2>&1
echo "8B bench $(el)" | tee -a $S; tail -16 $OUT/bench-8b.log | tee -a $S
source scripts/gpu_env.sh >/dev/null
left=$(( 585 - ($(date +%s)-T0) ))
if [ $left -gt 150 ]; then
  timeout 120 $B synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/gemma3-27b-q4_k_m.gguf 2>&1 | tail -1
  echo "27B written $(el)" | tee -a $S
  timeout $(( 588 - ($(date +%s)-T0) )) env QUANTS="" GEMMA27=1 PP_UBATCH="4096" PHASE=bench bash scripts/gpu_bench.sh > $OUT/bench-27b.log 2>&1
  echo "27B bench $(el)" | tee -a $S; tail -6 $OUT/bench-27b.log | tee -a $S
fi
tar -czf $OUT/json.tgz -C $W $(cd $W && ls tandem-*.json llama-*.json 2>/dev/null)
echo "===== summary"; cat $S
