#!/usr/bin/env bash
# Call e5: n1 = main after this session (be4e3ac: tile attention at eight warps of 16 keys) against
# m1 (3225b58, the session's start) and llama-bench -ngl 99 -fa 1 (the lean session's build): tg128
# m1 n1 L n1 m1 on the 8B Q4_K_M and Q8_0 and the 27B Q4_K_M, m1 n1 n1 m1 on gemma3-270m (the 8B
# files and gemma run while the 27B is written, at nice 19); n1's 27B kernels and timeline.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
M1=.gpu/tandem-m1; N1=.gpu/tandem-n1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( nice -n 19 $N1 synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf 2>&1 | tail -1 ) & P27=$!
( $N1 synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
( $N1 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) & PG=$!
$N1 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; wait $P8 $PG; echo "synth 8b done $(el)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { echo "$1 $2 $($3 bench -m $W/$2.gguf --device cuda -p 0 -n 128 -r $4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r $2 -o csv 2>>$W/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ for m in q4 q8; do tg m1 $m $M1 5; tg n1 $m $N1 5; lt $m 3; tg n1 $m $N1 5; tg m1 $m $M1 5; done; echo "at $(el)"
  tg m1 g $M1 6; tg n1 g $N1 6; tg n1 g $N1 6; tg m1 g $M1 6; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt; wait $P27; echo "27b synth done $(el)"
{ tg m1 g27 $M1 3; tg n1 g27 $N1 3; lt g27 3; tg n1 g27 $N1 3; tg m1 g27 $M1 3; echo "at $(el)"; } > $W/tg27.txt 2>&1
cat $W/tg.txt $W/tg27.txt >> $R; cat $W/tg27.txt
echo "== decode kernels n1 g27" >> $R; $N1 bench -m $W/g27.gguf --device cuda -p 0 -n 8 -r 1 -v 2>&1 | grep "decode kernel" >> $R
TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $N1 bench -m $W/g27.gguf --device cuda -p 0 -n 64 -r 1 2>>$W/trace.err | grep tg64
python3 scripts/trace_summary.py $W/trace.tsv --sequence 16 > $OUT/timeline-n1-g27.md 2>&1
head -16 $OUT/timeline-n1-g27.md | cut -c1-110; grep "decode kernel" $R; tail -2 $W/llama.err; tail -2 $W/bench.err; echo "total $(el)"
