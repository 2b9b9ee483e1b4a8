#!/usr/bin/env bash
# Call s4: what bounds the deterministic tensor-core kernels now that their activations are staged?
# Nsight Compute (the sections of the bulk session's k9) on the first four `mmq_q4_k` launches of a
# deterministic pp512 on the 8B Q4_K_M and the first four `mmq_q8_0` launches on the 8B Q8_0; v3 = main.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-v3; NCU=/usr/local/cuda/bin/ncu
$B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf > $W/s8.log 2>&1 &
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats --section InstructionStats"
for m in "q4 mmq_q4_k" "q8 mmq_q8_0"; do
  set -- $m; [ $1 = q8 ] && wait
  timeout 200 $NCU -k "regex:$2" --launch-count 4 $S $B bench -m $W/$1.gguf --device cuda --deterministic -p 512 -n 0 -r 1 > $OUT/ncu-$2.txt 2>&1; echo "ncu $2 exit $?"
  grep -E "^  mmq|Duration|Compute \(SM\) Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp Per|Registers Per|Stall|Mem Busy|Max Bandwidth" $OUT/ncu-$2.txt | cut -c1-110 | head -40
done
