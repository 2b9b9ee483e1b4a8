#!/usr/bin/env bash
# Call f3: the full benchmark on main as of this session (binary f3: 5cf552d's kernels, gpu-check with
# the three short-context cases): scripts/gpu_bench.sh's prepare phase (the synthetic 8B files,
# gpu-check on gemma3-270m and the 8B Q4_K_M, llama-bench unpacked from the flash session's CUDA
# build), its bench phase on the three 8B files (pp4096 at 512- and 4096-row micro-batches), then the
# Gemma-3-27B-shaped Q4_K_M written after the 8B runs (so its writing does not load the host they
# time) and benched the same way (pp4096 at 4096-row micro-batches).
T0=$(date +%s); el() { echo "$(( $(date +%s)-T0 )) s"; }
mkdir -p /tmp/fb/bin; gunzip -c .gpu/f/tandem-f3.gz > /tmp/fb/bin/f3; chmod +x /tmp/fb/bin/f3
export TANDEM=/tmp/fb/bin/f3 WORK=/tmp/fb LLAMA_PREBUILT=.gpu/llama-build CHECK_8B=1 S=$OUT/summary.txt
PP_UBATCH="512 4096" PHASE=prepare bash scripts/gpu_bench.sh > /tmp/fb/prepare.log 2>&1
cp /tmp/fb/check.md $OUT/check.md
echo "prepare $(el): $(grep -c '| yes |' /tmp/fb/check.md) yes, $(grep -c '| NO |' /tmp/fb/check.md) NO; $(grep 'exit' /tmp/fb/prepare.log | tr '\n' ' ')" | tee -a $S
grep "| NO |" /tmp/fb/check.md | cut -c1-300 | tee -a $S; grep "sha256\|greedy" /tmp/fb/check.md | cut -c1-200 | tee -a $S
PP_UBATCH="512 4096" PHASE=bench bash scripts/gpu_bench.sh > $OUT/bench-8b.log 2>&1
echo "8B bench $(el)" | tee -a $S; tail -16 $OUT/bench-8b.log | tee -a $S
source scripts/gpu_env.sh >/dev/null
timeout 240 /tmp/fb/bin/f3 synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o /tmp/fb/gemma3-27b-q4_k_m.gguf 2>&1 | tail -1
echo "27B written $(el)" | tee -a $S
timeout $(( 590 - ($(date +%s)-T0) )) env QUANTS="" GEMMA27=1 PP_UBATCH="4096" PHASE=bench bash scripts/gpu_bench.sh > $OUT/bench-27b.log 2>&1
echo "27B bench $(el)" | tee -a $S; tail -6 $OUT/bench-27b.log | tee -a $S
tail -3 /tmp/fb/bench.err /tmp/fb/llama.err 2>/dev/null
tar -czf $OUT/json.tgz -C /tmp/fb $(cd /tmp/fb && ls tandem-*.json llama-*.json 2>/dev/null)
echo "===== summary"; cat $S
