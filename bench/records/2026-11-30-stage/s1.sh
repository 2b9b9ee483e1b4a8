#!/usr/bin/env bash
# Call s1: v1 = main (b388763); v2 = exp/mmq-q6-bounds (mmq_q6_k at __launch_bounds__(128, 4): 128
# registers instead of 150). gpu-check v1 on gemma3-270m (the deterministic hash 3503891a7783... with
# the staged tensor-core kernels, not yet run on a GPU); gpu-check v2 on the 8B Q4_K_M (tensor-core
# rows bit-equal, hash e0cf7d15d85e... across chunk sizes 1, 64, 512); deterministic pp512 on the 8B
# Q4_K_M v1 v2 v2 v1.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-v1; B=.gpu/tandem-v2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$A synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
$A synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 200 $A gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
grep "| NO |" $OUT/check-g.md | cut -c1-400; grep -c "| yes |" $OUT/check-g.md; grep "tensor cores\|sha256\|greedy\|replay" $OUT/check-g.md | cut -c1-300; tail -2 $W/check-g.err
pp() { echo "$1 $($2 bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -r 2 2>>$W/bench.err | grep pp512 | cut -d'|' -f5)"; }
{ pp v1 $A; pp v2 $B; } > $R 2>&1; cat $R
timeout 200 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-300; grep -c "| yes |" $OUT/check-8b.md; grep "tensor cores\|sha256\|greedy" $OUT/check-8b.md | cut -c1-260; tail -2 $W/check-8b.err
{ pp v2 $B; pp v1 $A; echo "at $(el)"; } >> $R 2>&1; tail -3 $R
echo "total $(el)"
