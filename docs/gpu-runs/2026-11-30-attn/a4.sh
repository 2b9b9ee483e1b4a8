#!/usr/bin/env bash
# Call a4: the candidate f (2145389 on exp/norm-256: add_norm_to at 512 threads of float4s, Q8 blocks
# from registers, on top of a) against a (0a70f25) and llama-bench. gpu-check f on gemma3-270m and
# the 8B Q4_K_M + Q8_0 (hashes at 600), its add_norm_to rows now comparing the quants with the CPU's.
# tg128 a f L L f a on Q4_K_M and Q8_0; the 27B Q4_K_M (a f L f) if the call has time left.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-a; F=.gpu/tandem-f
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( s=$(date +%s); $A synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf > $W/synth27.log 2>&1; echo "synth 27b $(( $(date +%s)-s )) s" >> $W/synth27.log ) &
( $A synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P4=$!
( $A synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
$A synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 120 $F gpu-check -m $W/g.gguf > $OUT/check-g-f.md 2>$OUT/check-g-f.err; echo "check g f exit $? $(date +%T)"
wait $P4 $P8; echo "8b synth done $(date +%T)"
timeout 200 $F gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b-f.md 2>$OUT/check-8b-f.err; echo "check 8b f exit $? $(date +%T)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ for m in q4 q8; do tg a $A $m; tg f $F $m; lt $m; lt $m; tg f $F $m; tg a $A $m; done; } > $OUT/tg.txt 2>&1
echo "tg 8b done $(date +%T), $(( $(date +%s)-T0 )) s"
if [ $(( $(date +%s)-T0 )) -lt 400 ]; then wait; cat $W/synth27.log | tail -1
  { tg a $A g27; tg f $F g27; lt g27; tg f $F g27; } > $OUT/tg27.txt 2>&1; fi
for f in check-g-f check-8b-f; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-200; grep -c "| yes |" $OUT/$f.md; grep "add_norm_to\|sha256\|greedy\|replay" $OUT/$f.md | cut -c1-230; done
cat $OUT/tg.txt $OUT/tg27.txt 2>/dev/null; echo "total $(( $(date +%s)-T0 )) s"
