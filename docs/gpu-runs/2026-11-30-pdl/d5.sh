#!/usr/bin/env bash
# Call 5: Nsight Compute on the 8B Q4_K_M decode kernels (f2): where do the Q4_K matvecs stall?
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-f2; NCU=/usr/local/cuda/bin/ncu
[ -f $W/q4.gguf ] || $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats"
run() { local name=$1 count=$2; shift 2; timeout 200 $NCU -k "regex:$name" --launch-count $count $S "$@" $N bench -m $W/q4.gguf --device cuda -p 0 -n 2 -r 1 > $OUT/ncu-$name.txt 2>&1; echo "$name exit $? $(date +%T)"; }
run mmvq_q4_k_u1_r2_s1 8
run 'add_norm_to|attend_tiles' 4
run mmvqp_q6_k_u2_r1_s1 2
for f in $OUT/ncu-*.txt; do echo "== $f"; grep -E "^  [a-z_0-9]+.*\(|Grid Size|Registers Per|DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|L1/TEX Hit|ERR|Stall" $f | head -60; done | cut -c1-150
