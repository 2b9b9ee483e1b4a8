#!/usr/bin/env bash
# Call f3: where call f2's fused steps lose (binary f2): kernel timelines of tg128 on the 8B Q4_K_M,
# staged variants only, fusion on and off, with the first launches of a step in order.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-f2; R=$OUT/results.txt; P="u1r1s1p,u2r1s1p,u1r2s1p,u2r2s1p,u4r1s1p"
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
for c in fused plain; do
  f=""; [ $c = plain ] && f="TANDEM_CUDA_FUSE_NORM=0"
  env TANDEM_CUDA_MMVQ=$P $f TANDEM_CUDA_TRACE=$W/trace-$c.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  echo "== timeline $c" >> $R; python3 scripts/trace_summary.py $W/trace-$c.tsv --sequence 14 >> $R 2>&1
done
echo "done $(( $(date +%s)-T0 )) s"; tail -n 3 $W/trace.err
