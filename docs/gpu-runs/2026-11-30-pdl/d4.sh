#!/usr/bin/env bash
# Call 4: the landing tree (f2 = PDL weights + add_norm's norm weights loaded before the wait).
# gpu-check, then tg128 A B B A against llama-bench on the three 8B files, and f2 against p1 on Q4_K_M.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-f2; B=.gpu/tandem-p1
{ which ncu nsys; ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' '; } > $OUT/tools.txt 2>&1
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( $N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1
  $N synth --arch llama --shape llama3-8b --quant f16 --seed 1 -o $W/f16.gguf 2>&1 | tail -1 ) &
echo "synth q4 done $(date +%T)"
timeout 150 $N gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { local l=$1 bin=$2 f=$3; shift 3; echo "$l $f $(env "$@" $bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{
tg f2 $N q4 X=1; tg p1 $B q4 X=1; lt q4; lt q4; tg p1 $B q4 X=1; tg f2 $N q4 X=1
tg f2 $N q4 X=1; tg p1 $B q4 X=1; tg p1 $B q4 X=1; tg f2 $N q4 X=1
wait; echo "synth done $(date +%T)"
for f in q8 f16; do tg f2 $N $f X=1; lt $f; lt $f; tg f2 $N $f X=1; done
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
grep "| no |" $OUT/check.md | cut -c1-200; grep -c "| yes |" $OUT/check.md
grep "sha256\|greedy\|replay" $OUT/check.md | cut -c1-200
cat $OUT/tools.txt; echo; cat $OUT/tg.txt
