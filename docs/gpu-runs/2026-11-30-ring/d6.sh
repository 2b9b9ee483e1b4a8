#!/usr/bin/env bash
# Call d6: Nsight Compute on main's (q1) one-row Q4_K and Q6_K matvecs of the 8B Q4_K_M, inside a
# decode step (caches flushed before each profiled launch, as a step meets its weights), COUNT launches
# from the SKIP-th on (40 in call d6, which landed in the load-time timing of the output head; 4000
# with 64 tokens in call d7): what bounds the big matvecs (memory, issue, or latency)?
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-q1; NCU=/usr/local/cuda/bin/ncu
[ -f $W/q4.gguf ] || $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats"
timeout 240 $NCU -k "regex:mmvq[p]?_q[46]_k" --launch-skip ${SKIP:-40} --launch-count ${COUNT:-6} --clock-control none $S $N bench -m $W/q4.gguf --device cuda -p 0 -n ${NGEN:-8} -r 1 > $OUT/ncu-mmvq.txt 2>&1; echo "ncu exit $?"
grep -E "^  mmvq|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Registers Per|Grid Size|Block Size|Stall" $OUT/ncu-mmvq.txt | cut -c1-120 | head -160
