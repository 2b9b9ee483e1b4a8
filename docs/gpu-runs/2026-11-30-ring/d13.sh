#!/usr/bin/env bash
# Call d13: q3 = main with TANDEM_CUDA_PROFILE_REPLAYS (cuProfilerStart/Stop around chosen decode-graph
# replays). Nsight Compute with --profile-from-start off on the 8B Q4_K_M's 20th replay: the first 12
# integer K-quant matvec launches of that decode step, as the graph runs them (caches flushed before
# each, clocks not locked): what bounds them?
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-q3; NCU=/usr/local/cuda/bin/ncu
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats"
TANDEM_CUDA_PROFILE_REPLAYS=20-20 timeout 150 $NCU --profile-from-start off -k "regex:mmvq[p]?_q[46]_k" --launch-count 12 --clock-control none $S $N bench -m $W/q4.gguf --device cuda -p 0 -n 32 -r 1 > $OUT/ncu-step.txt 2>&1; echo "ncu exit $?"
grep -E "^  mmvq|Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|No Eligible|Registers Per|Grid Size" $OUT/ncu-step.txt | cut -c1-110 | head -100
