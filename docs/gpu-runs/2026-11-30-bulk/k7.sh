#!/usr/bin/env bash
# Call k7: how fast would a decode step be with the latency-bound kernels free? TANDEM_CUDA_SKIP
# leaves kernels out of the step (the logits are wrong; a timing experiment): attention, add + norm,
# gating, and all three, so the step is the matvecs, the head and their hand-overs. m5 = main.
# tg128 on the 8B Q4_K_M; the timeline with all three left out.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m5; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
tg() { echo "$1 $(env $2 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
ALL=add_norm_to,gated_quant,attend_tiles
{ tg none ""; tg attention TANDEM_CUDA_SKIP=attend_tiles; tg add-norm TANDEM_CUDA_SKIP=add_norm_to; tg gating TANDEM_CUDA_SKIP=gated_quant;
  tg all-three TANDEM_CUDA_SKIP=$ALL; tg all-three TANDEM_CUDA_SKIP=$ALL; tg none ""; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; grep -v "TANDEM_CUDA_SKIP" $W/bench.err | tail -3
TANDEM_CUDA_SKIP=$ALL TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv --sequence 12 > $OUT/timeline-skip-all.md 2>&1; head -14 $OUT/timeline-skip-all.md
echo "total $(el)"
