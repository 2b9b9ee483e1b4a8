#!/usr/bin/env bash
# Call h5: the landed tree's binary h3 (0833e68: logits through page-locked memory) on quiet cores:
# tg128 A B B A against h0 (75e07d3) and llama-bench on the 8B Q4_K_M and Q8_0, then against
# llama-bench on the Gemma-3-27B-shaped Q4_K_M; replay host times. Every synthesis finishes first.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-h3; A=.gpu/tandem-h0
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( $N synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf 2>&1 | tail -1 ) &
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait; echo "synth done $(date +%T)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ tg h3 $N q4; tg h0 $A q4; lt q4; lt q4; tg h0 $A q4; tg h3 $N q4
  tg h3 $N q8; tg h0 $A q8; lt q8; lt q8; tg h0 $A q8; tg h3 $N q8; } > $OUT/tg8b.txt 2>&1
echo "8b done $(date +%T)"; cat $OUT/tg8b.txt
TANDEM_CUDA_PASS_TIMES=1 $N bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 2 2> $OUT/pass-times-q4.txt >/dev/null
grep "^replay us" $OUT/pass-times-q4.txt | tail -200 | awk '{d+=$4; u+=$6; l+=$8; w+=$10; c+=$12; n++} END {printf "h3 q4 %d replays, means us: dry %.1f upload %.1f launch %.1f wait %.1f copy %.1f\n", n, d/n, u/n, l/n, w/n, c/n}'
{ tg h3 $N g27; lt g27; lt g27; tg h3 $N g27; } > $OUT/tg27.txt 2>&1; cat $OUT/tg27.txt
TANDEM_CUDA_PASS_TIMES=1 $N bench -m $W/g27.gguf --device cuda -p 0 -n 64 -r 1 2> $OUT/pass-times-g27.txt >/dev/null
grep "^replay us" $OUT/pass-times-g27.txt | tail -60 | awk '{d+=$4; u+=$6; l+=$8; w+=$10; c+=$12; n++} END {printf "h3 g27 %d replays, means us: dry %.1f upload %.1f launch %.1f wait %.1f copy %.1f\n", n, d/n, u/n, l/n, w/n, c/n}'
