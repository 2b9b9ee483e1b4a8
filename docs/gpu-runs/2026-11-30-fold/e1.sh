#!/usr/bin/env bash
# Call e1: x1 = main (m1 = 3225b58) with Q4_K_M's q + k and Q6_K v in one launch where the load-time
# timing finds it faster (`mmvqx_*`, branch exp/mixed-qkv). gpu-check x1 on the 8B Q4_K_M (the new
# mixed row; hash c82373b89722... kept?); tg128 m1 x1 x1 m1; x1's kernel choices; both timelines.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
M1=.gpu/tandem-m1; X1=.gpu/tandem-x1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$X1 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 200 $X1 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
echo "== check-8b"; grep "| NO |" $OUT/check-8b.md | cut -c1-240; grep -c "| yes |" $OUT/check-8b.md; grep -i "sha256\|greedy\|replay\|mixed" $OUT/check-8b.md | cut -c1-260
tg() { echo "$1 q4 $($2 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg m1 $M1; tg x1 $X1; tg x1 $X1; tg m1 $M1; } > $W/tg.txt 2>&1
echo "tg done $(el)"; cat $W/tg.txt >> $R
for v in m1 x1; do B=$M1; [ $v = x1 ] && B=$X1
  echo "== decode kernels $v" >> $R; $B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | head -12 >> $R
  TANDEM_CUDA_TRACE=$W/trace-$v.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  python3 scripts/trace_summary.py $W/trace-$v.tsv --sequence 12 > $OUT/timeline-$v.md 2>&1; done
for v in m1 x1; do head -3 $OUT/timeline-$v.md | tail -1 | cut -c1-120; grep "^| [0-9]* |" $OUT/timeline-$v.md | head -12 | cut -c1-80; done
grep -A9 "decode kernels" $R | grep -v "^--" | cut -c1-90; cat $W/tg.txt; tail -3 $W/bench.err; echo "total $(el)"
