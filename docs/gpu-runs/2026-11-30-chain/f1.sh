#!/usr/bin/env bash
# Call f1: add + norm inside the staged matvecs (binary f1, branch fused-norm): gpu-check's kernel
# checks (the fused kernels' bits against add_norm_to then the staged kernel) and the model checks
# on gemma3-270m and the 8B Q4_K_M (greedy against the CPU, graph replay, deterministic hashes);
# then tg128 on the 8B Q4_K_M with the fusion on and off (TANDEM_CUDA_FUSE_NORM=0), in order and
# reverse, and the load-time choices.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-f1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $P; echo "synth $(el)"
timeout 300 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(el)"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-300; grep "add + norm\|greedy\|replay\|sha256" $OUT/check.md | cut -c1-260
tail -3 $OUT/check.err
tg() { local l=$1; shift; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
{ tg fused X=1; tg plain TANDEM_CUDA_FUSE_NORM=0; tg plain TANDEM_CUDA_FUSE_NORM=0; tg fused X=1; } | tee -a $R
$B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep -i "x4096\|choice" | head -12 >> $R
echo "done $(el)"; tail -3 $W/bench.err
