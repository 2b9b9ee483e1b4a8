#!/usr/bin/env bash
# Call c4: n5 = n4 (main) with each K-quant step prefetching the lines of the step after into L2
# (`prefetch.global.L2`, per lane; Q8_0 unchanged). gpu-check n5 on the 8B Q4_K_M (hash at 600:
# only prefetches were added, so it must be main's); tg128 n4 n5 n5 n4 on Q4_K_M (six repetitions);
# n5's timeline.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N4=.gpu/tandem-n4; N5=.gpu/tandem-n5; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$N5 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 150 $N5 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-q4.md 2>$W/check.err; echo "check q4 exit $? $(el)"
grep "| NO |" $OUT/check-q4.md | cut -c1-240; grep -c "| yes |" $OUT/check-q4.md; grep "sha256\|greedy\|replay" $OUT/check-q4.md | cut -c1-200
tg() { echo "$1 q4 $($2 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg n4 $N4; tg n5 $N5; tg n5 $N5; tg n4 $N4; } > $W/tg.txt 2>&1; echo "tg done $(el)"; cat $W/tg.txt >> $R
TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $N5 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv --sequence 12 > $W/timeline.md 2>&1; echo "== timeline n5 q4" >> $R; cat $W/timeline.md >> $R
head -16 $W/timeline.md | cut -c1-110; grep "^| [0-9]* |" $W/timeline.md | head -12; cat $W/tg.txt; echo "total $(el)"
