#!/usr/bin/env bash
# Call f1: the instruction diet (exp/q6k-sums + exp/q4k-hi-nibble rebased on main, binary d1) against
# main (9e3a682, binary m1). gpu-check on d1 (bits and both hashes must not move) with the cold / hot L2
# matvec timings; tg128 A B B A twice against m1, and llama-bench, on the 8B Q4_K_M.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-d1; B=.gpu/tandem-m1
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( $N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait; echo "synth done $(date +%T)"
timeout 240 $N gpu-check --bench-l2 -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{
tg d1 $N q4; tg m1 $B q4; lt q4; lt q4; tg m1 $B q4; tg d1 $N q4
tg d1 $N q4; tg m1 $B q4; tg m1 $B q4; tg d1 $N q4
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
grep "| NO |" $OUT/check.md | cut -c1-200; grep -c "| yes |" $OUT/check.md
grep "sha256\|greedy\|replay\|cold / hot" $OUT/check.md | cut -c1-220
cat $OUT/tg.txt
