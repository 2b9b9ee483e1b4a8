#!/usr/bin/env bash
# Call s2: the streamed feed-forward kernel at 8, 16 and 24 compute warps (binary s2: two gate/up
# rows at a time, phase marks in the timeline). Kernel checks while the 8B Q4_K_M is written; tg128
# streamed at each size and chained, in order then reverse; then the timelines of stream16 and of
# the chained route (TANDEM_CUDA_TRACE), one layer's walk each.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/s/tandem-s2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 120 $B gpu-check > $OUT/kernels.md 2>$OUT/kernels.err; rc=$?; echo "kernel checks exit $rc $(el)"
grep "streamed" $OUT/kernels.md | cut -c1-200; grep "| NO |" $OUT/kernels.md | cut -c1-220; tail -2 $OUT/kernels.err
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
tg() { local l=$1; shift; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
{ for c in stream16 stream8 stream24 chained chained stream24 stream8 stream16; do tg $c TANDEM_CUDA_FFN=$c; done; } | tee -a $R
echo "tg done $(el)"; tail -2 $W/bench.err
trace() { local l=$1; shift
  env "$@" TANDEM_CUDA_TRACE=$W/trace-$l.tsv timeout 60 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  echo "== timeline $l" >> $R; python3 scripts/trace_summary.py $W/trace-$l.tsv --gap-us 1000 --window-ms 150 --sequence 24 2>&1 | tail -40 >> $R; }
trace stream16 TANDEM_CUDA_FFN=stream16; trace chained TANDEM_CUDA_FFN=chained
echo "all done $(el)"; tail -n 3 $W/trace.err
