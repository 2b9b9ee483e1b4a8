#!/usr/bin/env bash
# Call c5: n6 = n4 (main) with the K-quant steps of rows of 32 super-blocks or more (the down
# projections) prefetching the lines of the step after into L2 (`prefetch.global.L2`, per lane).
# No gpu-check (too little device time left; n6's prefetches are a subset of n5's, which passed in
# c4); tg128 n4 n6 n6 n4 on Q4_K_M (six repetitions); n6's timeline.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N4=.gpu/tandem-n4; N6=.gpu/tandem-n6; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$N6 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
tg() { echo "$1 q4 $($2 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg n4 $N4; tg n6 $N6; tg n6 $N6; tg n4 $N4; } > $W/tg.txt 2>&1; echo "tg done $(el)"; cat $W/tg.txt >> $R
TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $N6 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv --sequence 12 > $W/timeline.md 2>&1; echo "== timeline n6 q4" >> $R; cat $W/timeline.md >> $R
head -16 $W/timeline.md | cut -c1-110; grep "^| [0-9]* |" $W/timeline.md | head -12; cat $W/tg.txt; echo "total $(el)"
