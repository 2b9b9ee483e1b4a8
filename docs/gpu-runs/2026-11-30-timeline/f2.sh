#!/usr/bin/env bash
# Call f2: the kernel timeline (binary t1, exp/trace). tg128 on the 8B Q4_K_M and Q8_0 with
# TANDEM_CUDA_TRACE set and unset (what the recording costs), and the timeline's summary per file.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-t1
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait; echo "synth done $(date +%T)"
tg() { local f=$1; shift; echo "$f $* $(env "$@" $N bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench-$f.err | grep tg128 | cut -d'|' -f5)"; }
{
tg q4 X=1; tg q4 TANDEM_CUDA_TRACE=$OUT/trace-q4.tsv; tg q4 X=1
tg q8 X=1; tg q8 TANDEM_CUDA_TRACE=$OUT/trace-q8.tsv; tg q8 X=1
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
for f in q4 q8; do python3 scripts/trace_summary.py $OUT/trace-$f.tsv > $OUT/summary-$f.md 2>&1; done
gzip -k $OUT/trace-q4.tsv $OUT/trace-q8.tsv; rm -f $OUT/trace-q4.tsv $OUT/trace-q8.tsv
grep -h "trace" $OUT/bench-*.err | head -4
cat $OUT/tg.txt; cat $OUT/summary-q4.md | head -40; head -25 $OUT/summary-q8.md
