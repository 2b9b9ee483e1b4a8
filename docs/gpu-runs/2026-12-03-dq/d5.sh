#!/usr/bin/env bash
# Call d5: binary d4. Nsight Compute on the first dqmma launch of each form in `--bench-dqmma` (gate +
# up, 28672x4096: n1 at t=2, n2 at t=12): why the kernel reads 1.1-1.5 TB/s.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-d4.gz > $W/bin/d4; chmod +x $W/bin/d4; B=$W/bin/d4
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a $S
for k in n1 n2; do
    timeout 150 $NCU -k regex:dqmma_q4_k_$k -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis $B gpu-check --no-kernel-checks --bench-dqmma > $OUT/ncu-$k.txt 2>&1
    echo "ncu $k: exit $? ($(el))" | tee -a $S
    grep -E "DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Eligible Warps|Block Limit|Registers Per|Stall|Executed Ipc" $OUT/ncu-$k.txt | head -24 | tee -a $S
done
echo "===== summary"; cat $S
