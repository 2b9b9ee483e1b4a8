#!/usr/bin/env bash
# Call g3: h1 = main plus `gpu-check --bench-handover` (a step's hand-over: launches under
# programmatic edges, plain graph edges, one resident grid crossing grid-wide barriers). Then what
# --deterministic costs on the 8B Q4_K_M: pp512 and tg128, default and deterministic, A B B A.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-h1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf > $W/synth.log 2>&1 &
SP=$!
timeout 200 $B gpu-check --bench-handover > $OUT/handover.md 2>$W/handover.err; echo "handover exit $? $(el)"
grep "hand-over" $OUT/handover.md | tee -a $R; grep -c "| yes |" $OUT/handover.md; grep "| NO |" $OUT/handover.md | cut -c1-200; tail -2 $W/handover.err
wait $SP; tail -1 $W/synth.log; echo "synth done $(el)"
bn() { echo "$1 $($B bench -m $W/q4.gguf --device cuda $2 -p 512 -n 128 -r 3 2>>$W/bench.err | grep -E 'pp512|tg128' | cut -d'|' -f4,5 | tr '\n' ' ')"; }
{ bn default ""; bn deterministic --deterministic; bn deterministic --deterministic; bn default ""; echo "at $(el)"; } > $W/det.txt 2>&1; cat $W/det.txt >> $R; cat $W/det.txt; tail -3 $W/bench.err
echo "total $(el)"
