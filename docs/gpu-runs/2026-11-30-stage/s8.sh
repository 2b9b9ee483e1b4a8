#!/usr/bin/env bash
# Call s8: flash attention with two stages of K and V (branch exp/flash-b2: the next tile's K and V
# load during all of this tile's work, two barriers a tile instead of four). f2 = main plus the
# `_b2` variants of the 128-wide head; TANDEM_CUDA_FLASH_STAGES=2 makes prefill take them.
# gpu-check's kernel checks (every flash variant against the f64 reference), its flash timings, then
# pp4096 (4096-row micro-batches) and pp512 on the 8B Q4_K_M, stages 1 2 2 1.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-f2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf > $W/s4.log 2>&1 &
timeout 200 $B gpu-check --bench-flash > $OUT/check-kernels.md 2>$W/check.err; echo "check exit $? $(el)"
grep "| NO |" $OUT/check-kernels.md | cut -c1-300; grep -c "| yes |" $OUT/check-kernels.md; grep -i "flash" $OUT/check-kernels.md | cut -c1-200; tail -2 $W/check.err
wait; echo "synth done $(el)"
pp() { echo "stages $1 $(env TANDEM_CUDA_FLASH_STAGES=$1 $B bench -m $W/q4.gguf --device cuda -p 4096 -n 0 -r 2 --ubatch 4096 2>>$W/bench.err | grep pp4096 | cut -d'|' -f5) pp512 $(env TANDEM_CUDA_FLASH_STAGES=$1 $B bench -m $W/q4.gguf --device cuda -p 512 -n 0 -r 3 2>>$W/bench.err | grep pp512 | cut -d'|' -f5)"; }
{ pp 1; pp 2; pp 2; pp 1; echo "at $(el)"; } > $R 2>&1; cat $R; tail -3 $W/bench.err
