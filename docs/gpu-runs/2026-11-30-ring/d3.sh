#!/usr/bin/env bash
# Call d3: t1 = main (n4's kernels) with the load-time timing of decode kernels run inside a captured
# graph after a 4 us hold, with programmatic edges (`launch::time_in_step`), so weight loads issued
# before a kernel's wait count as they do in a decode step. tg128 n4 t1 t1 n4 on the 8B Q4_K_M, Q8_0
# and F16 (six repetitions, each run's wall time with its load and tuning); t1's kernel choices and
# its Q4_K_M timeline.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N4=.gpu/tandem-n4; T1=.gpu/tandem-t1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $T1 synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
( $T1 synth --arch llama --shape llama3-8b --quant f16 --seed 1 -o $W/f16.gguf 2>&1 | tail -1 ) & P16=$!
$T1 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; wait $P8 $P16; echo "synth done $(el)"
tg() { local s=$(date +%s%N); local v=$($2 bench -m $W/$3.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)
  echo "$1 $3 $v (run $(( ($(date +%s%N)-s)/1000000 )) ms)"; }
{ for m in q4 q8 f16; do tg n4 $N4 $m; tg t1 $T1 $m; tg t1 $T1 $m; tg n4 $N4 $m; done; } > $W/tg.txt 2>&1
echo "tg done $(el)"; cat $W/tg.txt >> $R
for m in q4 q8; do echo "== decode kernels t1 $m" >> $R; $T1 bench -m $W/$m.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | head -12 >> $R; done
TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $T1 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv --sequence 14 > $W/timeline.md 2>&1; echo "== timeline t1 q4" >> $R; cat $W/timeline.md >> $R
head -3 $W/timeline.md | tail -1 | cut -c1-120; grep "^| [0-9]* |" $W/timeline.md | head -14 | cut -c1-80
grep -A9 "decode kernels" $R | grep -v "^--" | cut -c1-90; cat $W/tg.txt; tail -3 $W/bench.err; echo "total $(el)"
