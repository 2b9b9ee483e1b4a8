#!/usr/bin/env bash
# Call s3: prefill of main (v3, 6a22166) against the prefill session's benched binary (o1 = 6d4d4c9,
# built again here), after call b1 measured pp512 and pp4096 4% below that session's table. On the
# 8B Q4_K_M and F16: pp512 (-r 3) and pp4096 at 4096-row micro-batches (-r 2), o1 v3 v3 o1.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-o1; B=.gpu/tandem-v3; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf > $W/s4.log 2>&1 &
$B synth --arch llama --shape llama3-8b --quant f16 --seed 1 -o $W/f16.gguf > $W/s16.log 2>&1 &
wait; echo "synth done $(el)"
pp() { for f in q4 f16; do
  echo "$1 $f pp512 $($2 bench -m $W/$f.gguf --device cuda -p 512 -n 0 -r 3 2>>$W/bench.err | grep pp512 | cut -d'|' -f5)"
  echo "$1 $f pp4096-ub4096 $($2 bench -m $W/$f.gguf --device cuda -p 4096 -n 0 -r 2 --ubatch 4096 2>>$W/bench.err | grep pp4096 | cut -d'|' -f5)"
done; }
{ pp o1 $A; pp v3 $B; pp v3 $B; pp o1 $A; echo "at $(el)"; } > $R 2>&1; cat $R; tail -3 $W/bench.err
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
