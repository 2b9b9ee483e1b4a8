#!/usr/bin/env bash
# Call 5: the landing tree (g5 = g4 without the mixed launch) end to end: gemma3-270m and 8B Q4_K_M.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-g5
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
timeout 120 $N gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
grep -v "^| matvec Seg\|^| matvec Warp\|^| matvec Lane\|^| gemm\|^| int8\|^| add_norm\|^| gated_pair\|flash" $OUT/check.md | tail -9 | cut -c1-170
