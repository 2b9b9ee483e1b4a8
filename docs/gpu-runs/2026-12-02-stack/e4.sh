#!/usr/bin/env bash
# Call e4: where a prefill pass goes now (binary e3, the landed form): the op profile
# (TANDEM_CUDA_PROFILE=1, GPU time per op) of the 8B Q4_K_M at pp512, and pp4096 at 512- and
# 4096-row micro-batches, one repetition each (its warm-up pass included: see e5).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
gunzip -c .gpu/f/tandem-e3.gz > $W/bin/e3; chmod +x $W/bin/e3; B=$W/bin/e3
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
echo "synth $(( $(date +%s)-T0 )) s"
for c in "pp512:-p 512" "ub512:-p 4096 --ubatch 512" "ub4096:-p 4096 --ubatch 4096"; do l=${c%%:*}; a=${c#*:};
  TANDEM_CUDA_PROFILE=1 timeout 120 $B bench -m $W/q4.gguf --device cuda $a -n 0 -r 1 > $OUT/bench-$l.txt 2> $OUT/profile-$l.txt
  echo "== $l ($(( $(date +%s)-T0 )) s)"; grep -i "tok/s\|pp" $OUT/bench-$l.txt | tail -2; head -30 $OUT/profile-$l.txt | cut -c1-160; done
