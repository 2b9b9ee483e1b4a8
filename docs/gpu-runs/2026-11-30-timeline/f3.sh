#!/usr/bin/env bash
# Call f3: binary a1 (the timeline, attention blocks taking a Q8_K group of heads and finishing a
# one-tile span alone, logits copied through page-locked memory) against m1 (main, 9e3a682).
# gpu-check on gemma3-270m (1,500-token hash prompt: 7aab7b67ac6e… expected), the 8B Q4_K_M (600:
# f88ec5d895f7… expected) and the 8B Q8_0; tg128 A B B A on Q4_K_M and Q8_0; a1's timeline on Q4_K_M.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-a1; B=.gpu/tandem-m1
( $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) &
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 200 $N gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$OUT/check-g.err; echo "check g exit $? $(date +%T)"
wait; echo "synth done $(date +%T)"
timeout 300 $N gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$OUT/check-8b.err; echo "check 8b exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; shift 3; echo "$l $f $(env "$@" $bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
tg a1 $N q4 X=1; tg m1 $B q4 X=1; tg m1 $B q4 X=1; tg a1 $N q4 X=1
tg a1 $N q8 X=1; tg m1 $B q8 X=1; tg m1 $B q8 X=1; tg a1 $N q8 X=1
tg a1-traced $N q4 TANDEM_CUDA_TRACE=$OUT/trace-q4.tsv
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
python3 scripts/trace_summary.py $OUT/trace-q4.tsv > $OUT/summary-q4.md 2>&1; gzip $OUT/trace-q4.tsv
for f in check-g check-8b; do grep "| NO |" $OUT/$f.md | cut -c1-200; grep -c "| yes |" $OUT/$f.md; grep "sha256\|greedy\|replay" $OUT/$f.md | cut -c1-230; done
cat $OUT/tg.txt; head -16 $OUT/summary-q4.md
