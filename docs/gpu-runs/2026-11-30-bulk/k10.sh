#!/usr/bin/env bash
# Call k10: m6 = main plus the deterministic tensor-core kernels (`mmq_q4_k`, `mmq_q6_k`) reading their
# activations from a tile staged once a block in shared memory by `cp.async` (two tiles in turn), after
# k9's profile (L1 at 96-97%). gpu-check on the 8B Q4_K_M (the tensor-core rows bit-equal with the
# batched matvec; the hash e0cf7d15d85e... across chunk sizes 1, 64, 512); deterministic pp512 m5 m6 m6 m5.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m6; H=.gpu/tandem-m5; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
pp() { echo "$1 $($2 bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -r 2 2>>$W/bench.err | grep pp512 | cut -d'|' -f5)"; }
{ pp m5 $H; pp m6 $B; } > $R 2>&1; cat $R
timeout 150 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-300; grep -c "| yes |" $OUT/check-8b.md; grep "tensor cores\|sha256\|greedy" $OUT/check-8b.md | cut -c1-260; tail -2 $W/check-8b.err
{ pp m6 $B; pp m5 $H; echo "at $(el)"; } >> $R 2>&1; tail -3 $R
echo "total $(el)"
