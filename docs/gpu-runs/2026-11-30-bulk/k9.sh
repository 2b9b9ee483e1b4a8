#!/usr/bin/env bash
# Call k9: what bounds the deterministic tensor-core kernels? Nsight Compute on the first six
# `mmq_q4_k` launches of a deterministic pp512 on the 8B Q4_K_M (layer 0: q, k, o, gate, up, ...),
# m5 = main: speed of light, occupancy, warp states (stall reasons), scheduler, memory workload.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m5; NCU=/usr/local/cuda/bin/ncu
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats --section InstructionStats"
timeout 240 $NCU -k "regex:mmq_q4_k" --launch-count 6 $S $B bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -r 1 > $OUT/ncu-mmq.txt 2>&1; echo "ncu exit $?"
grep -E "^  mmq|Duration|Compute \(SM\) Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Warp Cycles Per Issued|No Eligible|Issued Warp Per|Registers Per|Grid Size|Stall" $OUT/ncu-mmq.txt | cut -c1-120 | head -80
grep -iE "stall|smsp__pcsamp" $OUT/ncu-mmq.txt | head -30 | cut -c1-200
