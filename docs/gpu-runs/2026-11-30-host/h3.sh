#!/usr/bin/env bash
# Call h3: h3 (75e07d3 + the logits of a replayed step copied into page-locked memory, outside the
# graph; replay host times split) against h0 (75e07d3). gpu-check h3 on gemma3-270m (7aab7b67ac6e…)
# and the 8B Q4_K_M (f88ec5d895f7… at 600); tg128 A B B A twice on Q4_K_M and on Q8_0; h3's replay
# host times on Q4_K_M.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-h0; N=.gpu/tandem-h3
( $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) &
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 150 $N gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$OUT/check-g.err; echo "check g exit $? $(date +%T)"
wait; echo "synth done $(date +%T)"
timeout 150 $N gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-q4.md 2>$OUT/check-q4.err; echo "check q4 exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
tg h0 $A q4; tg h3 $N q4; tg h3 $N q4; tg h0 $A q4; tg h0 $A q4; tg h3 $N q4; tg h3 $N q4; tg h0 $A q4
tg h0 $A q8; tg h3 $N q8; tg h3 $N q8; tg h0 $A q8
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
TANDEM_CUDA_PASS_TIMES=1 $N bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 2 2> $OUT/pass-times-h3.txt >/dev/null
grep "^replay us" $OUT/pass-times-h3.txt | tail -200 | awk '{d+=$4; u+=$6; l+=$8; w+=$10; c+=$12; n++} END {printf "h3 q4 %d replays, means us: dry %.1f upload %.1f launch %.1f wait %.1f copy %.1f\n", n, d/n, u/n, l/n, w/n, c/n}'
grep "^pass: 1" $OUT/pass-times-h3.txt | tail -200 | awk '{e+=$5; g+=$8; w+=$11; n++} END {printf "h3: enqueue %.3f gpu %.3f wall %.3f ms\n", e/n, g/n, w/n}'
for f in check-g check-q4; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-200; grep -c "| yes |" $OUT/$f.md; grep "sha256\|greedy\|replay" $OUT/$f.md | cut -c1-200; done
cat $OUT/tg.txt
