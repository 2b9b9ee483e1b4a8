#!/usr/bin/env bash
# Call c2: why call c1's greedy chain was slower than host-fed steps. Binary c2 = c1 plus a second
# executable of the decode graph that chains alternate (TANDEM_CUDA_CHAIN_TWIN=0: one, as c1) and the
# chain's host times (TANDEM_CUDA_CHAIN_TIMES=1). tg128 on the 8B Q4_K_M: given, greedy with the
# twin, greedy without, in order then reverse; then the kernel timelines of given and greedy steps.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-c2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth $(el)"
tg() { local l=$1 mode=$2; shift 2; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 --tg-tokens $mode 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
{ for pass in 1 2; do
  if [ $pass = 1 ]; then order="given twin single"; else order="single twin given"; fi
  for c in $order; do case $c in
    given) tg given given X=1;;
    twin) tg twin greedy TANDEM_CUDA_CHAIN_TIMES=1;;
    single) tg single greedy TANDEM_CUDA_CHAIN_TIMES=1 TANDEM_CUDA_CHAIN_TWIN=0;;
  esac; done; done; } > $W/tg.txt 2>&1
echo "tg done $(el)"; cat $W/tg.txt | tee -a $R
grep "chain us" $W/bench.err | sort | uniq -c | sort -rn | head -12 | tee -a $R
for mode in given greedy; do
  TANDEM_CUDA_TRACE=$W/trace-$mode.tsv timeout 60 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 --tg-tokens $mode 2>>$W/trace.err | grep tg128
  python3 scripts/trace_summary.py $W/trace-$mode.tsv > $W/timeline-$mode.md 2>&1
  echo "== timeline $mode" >> $R; head -40 $W/timeline-$mode.md >> $R
done
echo "all done $(el)"; tail -5 $W/trace.err $W/bench.err
