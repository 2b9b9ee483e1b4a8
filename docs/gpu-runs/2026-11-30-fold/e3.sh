#!/usr/bin/env bash
# Call e3: p1 = main (m1) with the decode graphs' L2 prefetch branch (`prefetch.rs`: after a layer's
# q, k, v launch, o then gate then up; after down, the next layer's q, k, v; `TANDEM_CUDA_PREFETCH_MB`
# bytes a window, 0 = off, the same binary). tg128 on the 8B Q4_K_M at 0 32 16 48 48 16 32 0 MB and on
# the Q8_0 at 0 32 32 0; p1's timeline at 32; gpu-check p1 on the Q4_K_M (graph replay against direct
# launches, hash c82373b89722... kept).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
P1=.gpu/tandem-p1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $P1 synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
$P1 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; wait $P8; echo "synth done $(el)"
tg() { echo "mb=$1 $2 $(TANDEM_CUDA_PREFETCH_MB=$1 $P1 bench -m $W/$2.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for mb in 0 32 16 48 48 16 32 0; do tg $mb q4; done; echo "at $(el)"; for mb in 0 32 32 0; do tg $mb q8; done; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt >> $R; cat $W/tg.txt
TANDEM_CUDA_PREFETCH_MB=32 TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $P1 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv --sequence 12 > $OUT/timeline-p1.md 2>&1
head -18 $OUT/timeline-p1.md | cut -c1-110
timeout 200 $P1 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-300; grep -c "| yes |" $OUT/check-8b.md; grep "sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-260
tail -3 $W/bench.err; echo "total $(el)"
