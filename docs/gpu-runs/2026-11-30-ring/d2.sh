#!/usr/bin/env bash
# Call d2: does the load-time timing (kernels alone, after an L2 flush, launched the ordinary way) miss
# what the weight loads issued before WAIT_PRIOR_GRID() are worth inside the graph? main (n4) on the
# 8B Q4_K_M with the K-quant variants left to the timing (base) or limited to whole-row unrolls: F1
# = u2r1s1,u2r2s1 (a 4096-wide Q4_K row is two steps: all its loads before the wait), F2 = u4r1s1.
# tg128 base F1 F2 F2 F1 base, then each one's kernels and timeline.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N4=.gpu/tandem-n4; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$N4 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
cfg() { case $1 in base) echo X=1;; F1) echo TANDEM_CUDA_MMVQ=u2r1s1,u2r2s1;; F2) echo TANDEM_CUDA_MMVQ=u4r1s1;; esac; }
tg() { echo "$1 q4 $(env $(cfg $1) $N4 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg base; tg F1; tg F2; tg F2; tg F1; tg base; } > $W/tg.txt 2>&1; echo "tg done $(el)"; cat $W/tg.txt >> $R
for c in base F1 F2; do
  echo "== decode kernels $c" >> $R; env $(cfg $c) $N4 bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | head -12 >> $R
  env $(cfg $c) TANDEM_CUDA_TRACE=$W/trace-$c.tsv timeout 90 $N4 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  python3 scripts/trace_summary.py $W/trace-$c.tsv --sequence 14 > $W/timeline-$c.md 2>&1; echo "== timeline $c" >> $R; cat $W/timeline-$c.md >> $R
done
for c in base F1 F2; do echo "== $c"; head -3 $W/timeline-$c.md | tail -1 | cut -c1-120; grep "^| [0-9]* |" $W/timeline-$c.md | head -14 | cut -c1-80; done
grep -A9 "decode kernels" $R | grep -v "^--" | cut -c1-90; cat $W/tg.txt; echo "total $(el)"
