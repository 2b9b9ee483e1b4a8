#!/usr/bin/env bash
# Call g2: g2 = g1 plus TANDEM_CUDA_CARVEOUT=P (every kernel prefers P% of the unified L1 as shared
# memory; an SM runs one carveout at a time, so kernels of different preferences cannot overlap under
# programmatic edges). tg128 on the 8B Q4_K_M: (carveout, preload) = (-,0) (100,0) (100,4) (100,2)
# (100,2) (100,4) (100,0) (-,0); timelines at (100,0) and (100,4).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-g2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
tg() { echo "carve=$1 pre=$2 q4 $(env $([ "$1" != - ] && echo TANDEM_CUDA_CARVEOUT=$1) TANDEM_CUDA_PRELOAD=$2 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg - 0; tg 100 0; tg 100 4; tg 100 2; tg 100 2; tg 100 4; tg 100 0; tg - 0; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; tail -3 $W/bench.err
for v in 0 4; do
  TANDEM_CUDA_CARVEOUT=100 TANDEM_CUDA_PRELOAD=$v TANDEM_CUDA_TRACE=$W/trace-$v.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  python3 scripts/trace_summary.py $W/trace-$v.tsv --sequence 12 > $OUT/timeline-c100-p$v.md 2>&1; head -16 $OUT/timeline-c100-p$v.md; done
echo "total $(el)"
