#!/usr/bin/env bash
# Call e1: where a deep decode step's attention time goes (binary e0 = main 282eedc). The kernel
# timeline (TANDEM_CUDA_TRACE) of tg32 at depths 0 and 4096, and Nsight Compute on the fused decode
# kernel (attend_rope_d128) at both depths, clocks left as they are (--clock-control none), with the
# stall reasons and per-instruction samples at depth 4096.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
B=$W/bin/tandem; gunzip -c .gpu/e/tandem-e0.gz > $B; chmod +x $B
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth $(el)"
for d in 0 4096; do
  TANDEM_CUDA_TRACE=$OUT/trace-d$d.tsv timeout 120 $B bench -m $W/q4.gguf --device cuda -p 0 -n 32 -d $d -r 1 2>>$OUT/trace.err | grep tg32
  python3 scripts/trace_summary.py $OUT/trace-d$d.tsv --window-ms 30 --sequence 12 > $OUT/summary-d$d.md 2>&1; gzip $OUT/trace-d$d.tsv
  echo "trace d$d $(el)"
done
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --section SourceCounters --section InstructionStats --section ComputeWorkloadAnalysis"
for d in 0 4096; do
  timeout 200 $NCU --clock-control none -k "regex:attend_rope" --launch-skip 200 --launch-count 2 $S --print-details all \
    $B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -d $d -r 1 > $OUT/ncu-d$d.txt 2>&1; echo "ncu d$d exit $? $(el)"
done
timeout 200 $NCU --clock-control none -k "regex:attend_rope" --launch-skip 200 --launch-count 1 --section SourceCounters --section WarpStateStats \
  --page source --print-source sass --csv $B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -d 4096 -r 1 > $OUT/ncu-src-d4096.csv 2>&1; echo "ncu src exit $? $(el)"
gzip $OUT/ncu-src-d4096.csv
for d in 0 4096; do echo "== d$d"; head -30 $OUT/summary-d$d.md; done
for d in 0 4096; do echo "== ncu d$d"; grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Grid Size|Issued Warp|Theoretical Occ|Executed Ipc|L2 Hit" $OUT/ncu-d$d.txt | head -30; done | cut -c1-120
echo "all done $(el)"
