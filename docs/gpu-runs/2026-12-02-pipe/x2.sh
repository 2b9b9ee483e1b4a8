#!/usr/bin/env bash
# Call x2: binary x2 = the pipelined kernel with the activations staged through the ring as well
# (ldmatrix for both operands). Kernel checks; `--bench-qmma`; `ncu` on one gate + up launch at 8 and 32 rows.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-x2.gz > $W/bin/x2; chmod +x $W/bin/x2; B=$W/bin/x2
timeout 150 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S; grep -i "pipelined" $OUT/kernels.md | cut -c1-400 | tee -a $S
tail -3 $W/kernels.err | tee -a $S
TANDEM_BENCH_QMMA_ROWS=1,2,4,8,16,24,32,64 timeout 200 $B gpu-check --no-kernel-checks --bench-qmma > $OUT/bench-qmma.md 2>$W/bench.err
echo "bench-qmma: exit $? ($(el))" | tee -a $S; tail -3 $W/bench.err | tee -a $S
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a $S
if [ -n "$NCU" ]; then
  for k in t1_r4:8 t4_r4:32; do
    TANDEM_BENCH_QMMA_ROWS=${k#*:} timeout 120 $NCU -k regex:qmma_pipe_q4_k_${k%:*} -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis $B gpu-check --no-kernel-checks --bench-qmma > $OUT/ncu-${k%:*}.txt 2>&1
    echo "ncu ${k%:*}: exit $? ($(el))" | tee -a $S
  done
fi
echo "===== summary"; cat $S; echo; grep "batch speed" $OUT/bench-qmma.md | cut -c1-330
for f in $OUT/ncu-*.txt; do echo "== $f"; grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Stall|Warp Cycles Per Issued|Dynamic Shared|Compute \(SM\)|Issued Ipc|L1/TEX Hit|L2 Hit" $f | head -40; done
