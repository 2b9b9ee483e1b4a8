#!/usr/bin/env bash
# Call x1: binary x1 = main + the pipelined qmma kernel (`qmma_pipe_q4_k_*`, not routed yet). Every
# kernel check (the refactors 9f68f2e, 2546d54, a82c897 not run on the GPU before; the new kernel's
# rows), then `--bench-qmma` (the 8B's decode shapes at 2-64 rows: qmma, pipe r2 / r4, dp4a, cuBLAS).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-x1.gz > $W/bin/x1; chmod +x $W/bin/x1; B=$W/bin/x1
timeout 150 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S; grep -i "pipelined" $OUT/kernels.md | cut -c1-400 | tee -a $S
tail -5 $W/kernels.err | tee -a $S
timeout 200 $B gpu-check --no-kernel-checks --bench-qmma > $OUT/bench-qmma.md 2>$W/bench.err
echo "bench-qmma: exit $? ($(el))" | tee -a $S; tail -3 $W/bench.err | tee -a $S
echo "===== summary"; cat $S; echo; grep "batch speed" $OUT/bench-qmma.md | cut -c1-330
