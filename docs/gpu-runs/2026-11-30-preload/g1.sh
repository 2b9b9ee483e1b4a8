#!/usr/bin/env bash
# Call g1: g1 = main (be4e3ac's kernels) plus preloading variants of the staged one-row matvecs
# (`mmvq_preloaded`: each warp's first N row groups copied into shared memory before the programmatic
# wait; branch exp/preload). TANDEM_CUDA_PRELOAD=N swaps each staged choice for its N-group twin.
# tg128 on the 8B Q4_K_M with N = 0, 2, 4, 4, 2, 0; timelines at 0 and 4; then gpu-check with N = 4
# (every variant's bits, greedy tokens, replay, the hash e0cf7d15d85e... across chunk sizes).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-g1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
tg() { echo "pre=$1 q4 $(TANDEM_CUDA_PRELOAD=$1 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg 0; tg 2; tg 4; tg 4; tg 2; tg 0; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; tail -3 $W/bench.err
TANDEM_CUDA_PRELOAD=4 $B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep -i "int8" | sort | uniq -c | head -20 > $OUT/choices-4.txt
for v in 0 4; do
  TANDEM_CUDA_PRELOAD=$v TANDEM_CUDA_TRACE=$W/trace-$v.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  python3 scripts/trace_summary.py $W/trace-$v.tsv --sequence 12 > $OUT/timeline-$v.md 2>&1; head -12 $OUT/timeline-$v.md; done
echo "traces $(el)"
TANDEM_CUDA_PRELOAD=4 timeout 150 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-300; grep -c "| yes |" $OUT/check-8b.md; grep "sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-260; tail -3 $W/check-8b.err
echo "total $(el)"
