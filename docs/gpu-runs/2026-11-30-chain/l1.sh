#!/usr/bin/env bash
# Call l1: a dependent memory round trip alone and beside a stream of weights (binary l1 = main plus
# `gpu-check --bench-latency`, `tandem_cuda::latency`): the first question of
# docs/OVERLAPPED-DECODE.md. One thread chases a random cycle of 64 KB and 4 MB (L2 hits) and of
# 256 MB (misses) on a second stream, launched first, while `stream_weights` reads 4 GB on the whole
# GPU; the kernels' clocks give the times and check the overlap.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
timeout 300 .gpu/tandem-l1 gpu-check --bench-latency > $OUT/check.md 2>$OUT/check.err; echo "exit $?"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-200; grep "round trip" $OUT/check.md
