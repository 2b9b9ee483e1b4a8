#!/usr/bin/env bash
# Call c6: main's head (the review mends: one batch_routes for a matrix or a group). The routes it
# chooses on both models (to compare with c5's) and tg32 @ d128 at 1 and 4 sequences.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
gunzip -c .gpu/f/tandem-final.gz > $W/tandem; chmod +x $W/tandem; B=$W/tandem
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 40 $B bench -m $W/g.gguf --device cuda -v -r 1 -p 0 -n 32 -d 128 --parallel 1,4 2>&1 | grep -i "decode kernel\|tg32" | tee $OUT/g.txt
wait $PS
timeout 40 $B bench -m $W/q4.gguf --device cuda -v -r 1 -p 0 -n 32 -d 128 --parallel 1,4 2>&1 | grep -i "decode kernel\|tg32" | tee $OUT/q4.txt
