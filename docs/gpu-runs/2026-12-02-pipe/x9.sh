#!/usr/bin/env bash
# Call x9: where x8's 16-sequence step goes, op by op (TANDEM_CUDA_PROFILE=1: GPU time per op, graphs
# off), x8 against base, to see whether gate and up on the pipelined qmma are faster inside a step
# as they were alone (52 against cuBLAS's 62 us).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
for b in x8 base; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
$W/bin/x8 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
for l in x8 base; do
  TANDEM_CUDA_PROFILE=1 timeout 120 $W/bin/$l bench -m $W/q4.gguf --device cuda -p 0 -n 16 -d 128 --parallel 16 -r 1 > $OUT/bench-$l.txt 2> $OUT/profile-$l.txt
  echo "$l: exit $? ($(el))" | tee -a $S
done
for l in x8 base; do echo "== $l"; grep -A22 "GPU time per op" $OUT/profile-$l.txt | cut -c1-150; done | tee -a $S
