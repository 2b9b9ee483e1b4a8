#!/usr/bin/env bash
# Call e3: the full table. Binary e3 = main + the stacked q/k/v GEMM for chunks of up to 512 rows
# (the landed form). `scripts/gpu_bench.sh`: prepare (the three synthetic 8B files, kernel checks
# and gemma3-270m end to end; llama-bench unpacked from e2's build), then bench on the three 8B
# files (pp4096 at 512- and 4096-row micro-batches), A B B A. The 27B is left out (device time).
T0=$(date +%s); el() { echo "$(( $(date +%s)-T0 )) s"; }
W=/tmp/fb; mkdir -p $W/bin; gunzip -c .gpu/f/tandem-e3.gz > $W/bin/e3; chmod +x $W/bin/e3; B=$W/bin/e3
export TANDEM=$B WORK=$W LLAMA_PREBUILT=.gpu/llama-build S=$OUT/summary.txt
PP_UBATCH="512 4096" PHASE=prepare bash scripts/gpu_bench.sh > $W/prepare.log 2>&1
cp $W/check.md $OUT/check.md
echo "prepare $(el): $(grep -c '| yes |' $W/check.md) yes, $(grep -c '| NO |' $W/check.md) NO; $(grep 'exit' $W/prepare.log | tr '\n' ' ')" | tee -a $S
grep "| NO |" $W/check.md | cut -c1-300 | tee -a $S; grep "sha256\|greedy" $W/check.md | cut -c1-200 | tee -a $S
PP_UBATCH="512 4096" PHASE=bench timeout $(( 590 - ($(date +%s)-T0) )) bash scripts/gpu_bench.sh > $OUT/bench-8b.log 2>&1
echo "8B bench $(el)" | tee -a $S; tail -16 $OUT/bench-8b.log | tee -a $S
tar -czf $OUT/json.tgz -C $W $(cd $W && ls tandem-*.json llama-*.json 2>/dev/null)
echo "===== summary"; cat $S
