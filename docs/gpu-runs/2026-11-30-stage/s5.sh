#!/usr/bin/env bash
# Call s5: an upper bound for any design that keeps these matvec kernels. w7 = main plus
# TANDEM_CUDA_NO_WAIT=1 (branch exp/no-wait: WAIT_PRIOR_GRID() compiled out, so under the graph's
# programmatic edges each kernel runs as soon as it fits beside the one before; wrong results, a
# timing experiment). With attention, add + norm and gating also left out (TANDEM_CUDA_SKIP), the
# step is the matvecs streaming with no dependency between them. tg128 on the 8B Q4_K_M.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-w7; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
tg() { echo "$1 $(env $2 timeout 120 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
ALL=add_norm_to,gated_quant,attend_tiles
{ tg none ""; tg no-wait TANDEM_CUDA_NO_WAIT=1; tg skip3 TANDEM_CUDA_SKIP=$ALL; tg skip3+no-wait "TANDEM_CUDA_SKIP=$ALL TANDEM_CUDA_NO_WAIT=1";
  tg skip3+no-wait "TANDEM_CUDA_SKIP=$ALL TANDEM_CUDA_NO_WAIT=1"; tg skip3 TANDEM_CUDA_SKIP=$ALL; tg no-wait TANDEM_CUDA_NO_WAIT=1; tg none ""; echo "at $(el)"; } > $R 2>&1
cat $R; grep -v "TANDEM_CUDA_SKIP" $W/bench.err | tail -3
echo "total $(el)"
