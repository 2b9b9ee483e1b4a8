#!/usr/bin/env bash
# Call d12: q2 = q1 with the QK-norm weights read only by threads that rotate a pair (the others'
# pair indices pass the head: an out-of-range shared read at small head sizes, harmless in d4 but
# not to be left). gpu-check q2 on gemma3-270m: the tile checks at every head size with and without
# QK-norm, greedy against the CPU, the hashes across chunk sizes.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
Q2=.gpu/tandem-q2
$Q2 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 200 $Q2 gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $?"
grep "| NO |" $OUT/check-g.md | cut -c1-300; grep -c "| yes |" $OUT/check-g.md; grep -c "QK-norm (output, K, V) bit-equal to rms_norm first: true" $OUT/check-g.md
grep "sha256\|greedy\|replay" $OUT/check-g.md | cut -c1-240
