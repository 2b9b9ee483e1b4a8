#!/usr/bin/env bash
# Call x4: x3 failed with a misaligned address. compute-sanitizer on one launch of each block height
# (8 rows, the first shape), then the bench of the heights that run clean.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-x4.gz > $W/bin/x4; chmod +x $W/bin/x4; B=$W/bin/x4
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
$B gpu-check --no-kernel-checks --bench-matvec >/dev/null 2>&1 || true  # compile and cache the kernels first
for rt in 1 2 4; do
  TANDEM_BENCH_QMMA_ROWS=8 TANDEM_BENCH_QMMA_ROW_TILES=$rt timeout 100 $CS --tool memcheck --print-limit 3 $B gpu-check --no-kernel-checks --bench-qmma > $OUT/sanitizer-r$rt.txt 2>&1
  echo "sanitizer r$rt: exit $? ($(el))" | tee -a $S
  grep -m12 -E "Invalid|Misaligned|at 0x|by thread|Address|ERROR SUMMARY|qmma_pipe" $OUT/sanitizer-r$rt.txt | cut -c1-200 | tee -a $S
done
echo "===== summary"; cat $S
