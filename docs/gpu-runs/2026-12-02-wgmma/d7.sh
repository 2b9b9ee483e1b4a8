#!/usr/bin/env bash
# Call d7: new = the warpgroup kernels' copies with each thread's chunk and swizzled place computed
# once (35% fewer instructions in the 64-key form, 23% in the 128-key one); prev = d6's binary.
# Every kernel check and the flash timings on new, then the timings on prev and new again (A B A).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
S=$OUT/summary.txt
for b in new prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
timeout 150 $W/bin/new gpu-check --bench-flash > $OUT/kernels.md 2>$OUT/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(( $(date +%s)-T0 )) s)" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "flash timing.*_w" $OUT/kernels.md | sed 's/^/new /' | cut -c1-200 | tee -a $S
for b in prev new; do timeout 40 $W/bin/$b gpu-check --no-kernel-checks --bench-flash 2>/dev/null | grep -i "flash timing.*_w" | sed "s/^/$b /" | cut -c1-200 | tee -a $S; done
echo "done $(( $(date +%s)-T0 )) s" | tee -a $S
