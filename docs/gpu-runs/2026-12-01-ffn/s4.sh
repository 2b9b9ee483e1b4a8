#!/usr/bin/env bash
# Call s4: how many weight chunks the streamed kernel's feeding lane requests before the previous
# kernel has finished (binary s4: TANDEM_CUDA_FFN_EARLY; s3 requested the whole ring, 192 KB a
# multiprocessor, while add + norm ran). tg128 on the 8B Q4_K_M at 16 compute warps with all, none
# and 4 chunks early, and chained, in order then reverse; then the timeline with none early.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/s/tandem-s4; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth $(el)"
tg() { local l=$1; shift; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
run() { case $1 in
    all) tg all TANDEM_CUDA_FFN=stream16;;
    none) tg none TANDEM_CUDA_FFN=stream16 TANDEM_CUDA_FFN_EARLY=0;;
    four) tg four TANDEM_CUDA_FFN=stream16 TANDEM_CUDA_FFN_EARLY=4;;
    chained) tg chained TANDEM_CUDA_FFN=chained;;
  esac; }
{ for c in all none four chained chained four none all; do run $c; done; } | tee -a $R
echo "tg done $(el)"; tail -2 $W/bench.err
trace() { local l=$1; shift
  env "$@" TANDEM_CUDA_TRACE=$W/trace-$l.tsv timeout 60 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  echo "== timeline $l" >> $R; python3 scripts/trace_summary.py $W/trace-$l.tsv --gap-us 1000 --window-ms 150 2>&1 | tail -24 >> $R; }
trace none TANDEM_CUDA_FFN=stream16 TANDEM_CUDA_FFN_EARLY=0
echo "all done $(el)"; tail -n 3 $W/trace.err
