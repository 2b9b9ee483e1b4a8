#!/usr/bin/env bash
# Call f6: the review mend of gpu-check's fused rows (the chained route starts from q and K already
# normed by the check's own `rms_norm` run instead of norming them again): the kernel checks.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
gunzip -c .gpu/f/tandem-f6.gz > $W/f6; chmod +x $W/f6
timeout 150 $W/f6 gpu-check > $OUT/kernels.md 2>$W/kernels.err; rc=$?
echo "kernel checks: exit $rc, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO" | tee $OUT/summary.txt
echo "fused rows bit-equal to the chained route: $(grep -c 'rope_kv_store then the cached kernel: true, with QK-norm (rms_norm first): true' $OUT/kernels.md)" | tee -a $OUT/summary.txt
grep "| NO |" $OUT/kernels.md | cut -c1-300
