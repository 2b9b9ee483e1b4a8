#!/usr/bin/env bash
# Call 7: f3 = f2 + two-way split Q4_K variants (u1r1s2, u1r2s2). Choices, tg128 A B B A against f2, checks.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-f3; B=.gpu/tandem-f2
[ -f $W/q4.gguf ] || $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
$N bench -v -m $W/q4.gguf --device cuda -p 0 -n 1 -r 1 2>&1 | grep "decode kernel" > $OUT/choices.txt
tg() { local l=$1 bin=$2; shift 2; echo "$l $(env "$@" $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg f3 $N X=1; tg f2 $B X=1; tg f2 $B X=1; tg f3 $N X=1; tg f3 $N X=1; tg f2 $B X=1; tg f2 $B X=1; tg f3 $N X=1; } > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
timeout 110 $N gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
grep "| no |" $OUT/check.md | cut -c1-200; grep -c "| yes |" $OUT/check.md
grep "Int8 Q4_K\|sha256\|replay\|greedy" $OUT/check.md | cut -c1-220
cat $OUT/choices.txt $OUT/tg.txt
