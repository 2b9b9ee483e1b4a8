#!/usr/bin/env bash
# Call l2: l1's round trips again, and beside a 24 MB stream that L2 holds (binary l2): whether the
# round trips slow down in the memory's queues or in the L2 and its network.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
timeout 300 .gpu/tandem-l2 gpu-check --bench-latency > $OUT/check.md 2>$OUT/check.err; echo "exit $?"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-200; grep "round trip" $OUT/check.md
