#!/usr/bin/env bash
# Call d3: binary new = d2's + a 128-key-tile form of the pipelined warpgroup kernel (`k128_m2_p`) and
# `gpu-check --no-kernel-checks`. The kernel checks and flash timings, then Nsight Compute on one
# 4096-query launch of each 128-wide variant: where the warpgroup kernels lose to `mma.sync`.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-new.gz > $W/bin/new; chmod +x $W/bin/new; B=$W/bin/new
timeout 200 $B gpu-check --bench-flash > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "flash" $OUT/kernels.md | grep -v "rel err" | cut -c1-200 | tee -a $S
tail -2 $W/kernels.err | tee -a $S
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU" | tee -a $S
for k in k64_m1_r k64_m2_s k64_m1_w k64_m2_w k64_m2_p k128_m2_p; do
  timeout 90 $NCU --clock-control none -k regex:flash_prefill_d128_${k}\$ -c 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section InstructionStats $B gpu-check --no-kernel-checks --bench-flash > $OUT/ncu-$k.txt 2>&1
  echo "ncu $k: exit $? ($(el))" | tee -a $S
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Executed Ipc A|Shared Memory Configuration Size|Dynamic Shared" $OUT/ncu-$k.txt | sed 's/  */ /g' | head -24 | tee -a $S
done
echo "all done $(el)"; echo "===== summary"; cat $S
