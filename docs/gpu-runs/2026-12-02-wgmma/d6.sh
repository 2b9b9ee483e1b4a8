#!/usr/bin/env bash
# Call d6: the final head (d5's kernels + a trap when the dynamic shared memory is not 1024-byte
# aligned): every kernel check and the flash timings, to confirm the landed binary measures as d5's.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-new.gz > $W/bin/new; chmod +x $W/bin/new
timeout 200 $W/bin/new gpu-check --bench-flash > $OUT/kernels.md 2>$OUT/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(( $(date +%s)-T0 )) s)" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "flash timing" $OUT/kernels.md | cut -c1-200 | tee -a $S
