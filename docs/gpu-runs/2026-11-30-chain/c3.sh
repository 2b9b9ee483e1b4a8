#!/usr/bin/env bash
# Call c3: where a greedy chain's step-to-step time goes. Binary c3 = c2 plus two timing knobs:
# TANDEM_CUDA_CHAIN_AHEAD=0 (queue a step only after the one before has finished: picked on the GPU,
# no logits copy, but no run-ahead) and TANDEM_CUDA_CHAIN_SKIP_UPLOAD=1 (no parameter upload after the
# first step: wrong results, a bound). tg128 on the 8B Q4_K_M in order then reverse; then timelines.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-c3; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth $(el)"
tg() { local l=$1 mode=$2; shift 2; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 --tg-tokens $mode 2>>$W/bench-$l.err | grep tg128 | cut -d'|' -f4,5)"; }
run() { case $1 in
    given) tg given given X=1;;
    ahead) tg ahead greedy TANDEM_CUDA_CHAIN_TIMES=1;;
    noahead) tg noahead greedy TANDEM_CUDA_CHAIN_TIMES=1 TANDEM_CUDA_CHAIN_AHEAD=0;;
    noupload) tg noupload greedy TANDEM_CUDA_CHAIN_TIMES=1 TANDEM_CUDA_CHAIN_SKIP_UPLOAD=1;;
  esac; }
{ for c in given ahead noahead noupload noupload noahead ahead given; do run $c; done; } > $W/tg.txt 2>&1
echo "tg done $(el)"; cat $W/tg.txt | tee -a $R
for l in ahead noahead noupload; do echo "$l: $(grep 'chain us' $W/bench-$l.err | tail -3 | tr '\n' ' ')" | tee -a $R; done
trace() { local l=$1 mode=$2; shift 2
  env "$@" TANDEM_CUDA_TRACE=$W/trace-$l.tsv timeout 60 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 --tg-tokens $mode 2>>$W/trace.err | grep tg128
  echo "== timeline $l" >> $R; python3 scripts/trace_summary.py $W/trace-$l.tsv --gap-us 1000 --window-ms 150 2>&1 | head -20 >> $R; }
trace given given X=1; trace ahead greedy X=1; trace noahead greedy TANDEM_CUDA_CHAIN_AHEAD=0
echo "all done $(el)"; tail -n 5 $W/trace.err
