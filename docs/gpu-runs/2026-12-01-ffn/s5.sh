#!/usr/bin/env bash
# Call s5: chunks asked into L2 ahead of the streamed kernel's ring (binary s5:
# TANDEM_CUDA_FFN_AHEAD, `cp.async.bulk.prefetch.L2`), so that memory keeps streaming while the
# compute warps wait. Kernel checks (half the cases with 8 chunks ahead) while the 8B Q4_K_M is
# written; tg128 at 8 compute warps with 0, 8 and 16 chunks ahead, 16 warps with 16 ahead, and
# chained, in order then reverse; then the timeline of 8 warps, 16 ahead.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/s/tandem-s5; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 120 $B gpu-check > $OUT/kernels.md 2>$OUT/kernels.err; rc=$?; echo "kernel checks exit $rc $(el)"
grep -c "streamed.*| yes |" $OUT/kernels.md; grep "| NO |" $OUT/kernels.md | cut -c1-220; tail -1 $OUT/kernels.err
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
tg() { local l=$1; shift; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
run() { case $1 in
    w8a0) tg $1 TANDEM_CUDA_FFN=stream8;;
    w8a8) tg $1 TANDEM_CUDA_FFN=stream8 TANDEM_CUDA_FFN_AHEAD=8;;
    w8a16) tg $1 TANDEM_CUDA_FFN=stream8 TANDEM_CUDA_FFN_AHEAD=16;;
    w16a16) tg $1 TANDEM_CUDA_FFN=stream16 TANDEM_CUDA_FFN_AHEAD=16;;
    chained) tg $1 TANDEM_CUDA_FFN=chained;;
  esac; }
{ for c in w8a0 w8a8 w8a16 w16a16 chained chained w16a16 w8a16 w8a8 w8a0; do run $c; done; } | tee -a $R
echo "tg done $(el)"; tail -2 $W/bench.err
trace() { local l=$1; shift
  env "$@" TANDEM_CUDA_TRACE=$W/trace-$l.tsv timeout 60 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  echo "== timeline $l" >> $R; python3 scripts/trace_summary.py $W/trace-$l.tsv --gap-us 1000 --window-ms 150 2>&1 | tail -24 >> $R; }
trace w8a16 TANDEM_CUDA_FFN=stream8 TANDEM_CUDA_FFN_AHEAD=16
echo "all done $(el)"; tail -n 3 $W/trace.err
