#!/usr/bin/env bash
# Call h4 (the session's final): h4 (0833e68 + the logits copied in four parts, each moved into the
# vector while the next arrives) checked on gemma3-270m (graph replay bit-identical, 7aab7b67ac6e…),
# then tg128 against llama-bench on the 8B Q4_K_M, Q8_0, F16 and the Gemma-3-27B-shaped Q4_K_M, A B B A
# (h3 = 0833e68, one part, beside it on Q4_K_M). Synthesis runs on cores 2-15, benchmarks on 0-1.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-h4; O=.gpu/tandem-h3
command -v taskset >/dev/null && { BG="taskset -c 2-15"; FG="taskset -c 0,1"; } || { BG=""; FG=""; }
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( s=$(date +%s); $BG $N synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf > $OUT/synth27.log 2>&1; echo "synth 27b $(( $(date +%s)-s )) s" >> $OUT/synth27.log ) &
P27=$!
( $BG $N synth --arch llama --shape llama3-8b --quant f16 --seed 1 -o $W/f16.gguf 2>&1 | tail -1 ) & P1=$!
( $BG $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P2=$!
( $BG $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P3=$!
$FG $N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 150 $FG $N gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$OUT/check-g.err; echo "check g exit $? $(date +%T)"
wait $P1 $P2 $P3
echo "8b synth done $(date +%T)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($FG $bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($FG $LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{
tg h4 $N q4; lt q4; tg h3 $O q4; tg h3 $O q4; lt q4; tg h4 $N q4
tg h4 $N q8; lt q8; lt q8; tg h4 $N q8
tg h4 $N f16; lt f16; lt f16; tg h4 $N f16
} > $OUT/tg8b.txt 2>&1
echo "8b done $(date +%T)"
for b in h3 h4; do TANDEM_CUDA_PASS_TIMES=1 $FG .gpu/tandem-$b bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 2 2> $OUT/pass-times-$b.txt >/dev/null
grep "^replay us" $OUT/pass-times-$b.txt | tail -200 | awk -v b=$b '{d+=$4; u+=$6; l+=$8; w+=$10; c+=$12; n++} END {printf "%s q4 %d replays, means us: dry %.1f upload %.1f launch %.1f wait %.1f copy %.1f\n", b, n, d/n, u/n, l/n, w/n, c/n}'; done
wait; tail -1 $OUT/synth27.log
{ tg h4 $N g27; lt g27; lt g27; tg h4 $N g27; } > $OUT/tg27.txt 2>&1
TANDEM_CUDA_PASS_TIMES=1 $FG $N bench -m $W/g27.gguf --device cuda -p 0 -n 64 -r 1 2> $OUT/pass-times-g27.txt >/dev/null
grep "^replay us" $OUT/pass-times-g27.txt | tail -60 | awk '{d+=$4; u+=$6; l+=$8; w+=$10; c+=$12; n++} END {printf "h4 g27 %d replays, means us: dry %.1f upload %.1f launch %.1f wait %.1f copy %.1f\n", n, d/n, u/n, l/n, w/n, c/n}'
grep "| NO |" $OUT/check-g.md | cut -c1-200; grep -c "| yes |" $OUT/check-g.md; grep "sha256\|greedy\|replay" $OUT/check-g.md | cut -c1-200
cat $OUT/tg8b.txt $OUT/tg27.txt
