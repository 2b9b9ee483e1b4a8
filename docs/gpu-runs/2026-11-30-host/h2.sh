#!/usr/bin/env bash
# Call h2: h1 (2b9ce2b: attention loads the cache rows of earlier passes before its wait; replay host
# times split) and h2 (h1 plus the logits copied by a node of the decode graph into page-locked
# memory) against h0 (75e07d3). gpu-check: h1 on gemma3-270m (7aab7b67ac6e… expected at 1,500 tokens;
# the 512-row ring wraps, so replays load across the wrap) and the 8B Q4_K_M + Q8_0 (f88ec5d895f7…
# at 600); h2 on gemma3-270m. tg128 A B B A; replay host times for h1 and h2.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-h0; N=.gpu/tandem-h1; P=.gpu/tandem-h2
( $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) &
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 150 $N gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$OUT/check-g.err; echo "check g exit $? $(date +%T)"
timeout 100 $P gpu-check -m $W/g.gguf > $OUT/check-g-h2.md 2>$OUT/check-g-h2.err; echo "check g h2 exit $? $(date +%T)"
wait; echo "synth done $(date +%T)"
timeout 200 $N gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$OUT/check-8b.err; echo "check 8b exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
tg h0 $A q4; tg h1 $N q4; tg h2 $P q4; tg h2 $P q4; tg h1 $N q4; tg h0 $A q4
tg h0 $A q8; tg h1 $N q8; tg h1 $N q8; tg h0 $A q8
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
for b in h1 h2; do bin=.gpu/tandem-$b; TANDEM_CUDA_PASS_TIMES=1 $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 2 2> $OUT/pass-times-$b.txt >/dev/null
grep "^replay us" $OUT/pass-times-$b.txt | tail -200 | awk -v b=$b '{d+=$4; u+=$6; l+=$8; w+=$10; c+=$12; n++} END {printf "%s q4 %d replays, means us: dry %.1f upload %.1f launch %.1f wait %.1f copy %.1f\n", b, n, d/n, u/n, l/n, w/n, c/n}'; done
for f in check-g check-g-h2 check-8b; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-200; grep -c "| yes |" $OUT/$f.md; grep "sha256\|greedy\|replay" $OUT/$f.md | cut -c1-200; done
cat $OUT/tg.txt
