#!/usr/bin/env bash
# Call 6: Nsight Compute across the Q4_K decode shapes, tuned (u1r2s1) against forced u2r1s1 and u1r1s1.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-f2; NCU=/usr/local/cuda/bin/ncu
[ -f $W/q4.gguf ] || $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
run() { local tag=$1 k=$2 v=$3; TANDEM_CUDA_MMVQ=$v timeout 150 $NCU -k "regex:$k" --launch-count 60 $S $N bench -m $W/q4.gguf --device cuda -p 0 -n 2 -r 1 > $OUT/ncu-$tag.txt 2>&1; echo "$tag exit $? $(date +%T)"; }
run r2 mmvq_q4_k_u1_r2_s1 u1r2s1
run u2 mmvq_q4_k_u2_r1_s1 u2r1s1
run u1 mmvq_q4_k_u1_r1_s1 u1r1s1
run p2 mmvqp_q4_k_u2_r1_s1 u2r1s1p
for t in r2 u2 u1 p2; do awk -v t=$t '
/^  mmvq/ {grid=$2}
/Duration/ {d=$3} /DRAM Throughput/ {dr=$4} /Achieved Occupancy/ {ao=$4} /Issue Slots Busy|Issued Warp Per Scheduler/ {is=$NF}
/Eligible Warps Per Scheduler/ {el=$NF} /L1TEX \(local, global/ {l1="L1TEX"} 
/Stall Long Scoreboard|Est. Speedup/ {}
/Achieved Active Warps/ {printf "%s %s dur=%s dram=%s%% occ=%s%% issue=%s elig=%s\n", t, grid, d, dr, ao, is, el}' $OUT/ncu-$t.txt | sort | uniq -c | sort -k3,3 -k4,4 | head -20; done
