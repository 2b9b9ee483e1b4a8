#!/usr/bin/env bash
# Call f5: binary n1 (the timeline + add_norm_to holding up to eight elements a thread, so rows of
# up to 8192 stay in registers: Gemma-3-27B's 5376 took passes over memory). gpu-check on gemma3-270m
# (kernel checks, with new add_norm_to rows at widths 640 to 8192 against f64; hash 7aab7b67ac6e…
# expected at 1,500 tokens), then the 8B Q4_K_M (f88ec5d895f7… expected at 600).
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-n1
( $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) &
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 120 $N gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$OUT/check-g.err; echo "check g exit $? $(date +%T)"
grep "| NO |" $OUT/check-g.md | cut -c1-200; grep -c "| yes |" $OUT/check-g.md
grep "add_norm_to\|sha256\|greedy\|replay" $OUT/check-g.md | cut -c1-230
wait; echo "synth done $(date +%T)"
timeout 100 $N gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-q4.md 2>$OUT/check-q4.err; echo "check q4 exit $? $(date +%T)"
grep "| NO |" $OUT/check-q4.md | cut -c1-200; grep "q4.gguf" $OUT/check-q4.md | cut -c1-230
