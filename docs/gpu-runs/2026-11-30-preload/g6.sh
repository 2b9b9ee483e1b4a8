#!/usr/bin/env bash
# Call g6: m2 = m1 with the Q4_K tensor-core kernel's fragments permuted within each sub-block (8-byte
# loads of activations and weights; the integer sums are the same). gpu-check m2 on the 8B Q4_K_M;
# the op profile of a deterministic pp512 (m2); then deterministic pp512 m1 against m2, A B B A.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m2; M=.gpu/tandem-m1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 200 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-400; grep -c "| yes |" $OUT/check-8b.md; grep "tensor cores\|sha256" $OUT/check-8b.md | cut -c1-300; tail -2 $W/check-8b.err
TANDEM_CUDA_PROFILE=1 $B bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -r 1 > $W/prof.out 2> $OUT/profile-det-pp512.txt; head -40 $OUT/profile-det-pp512.txt
bn() { echo "$1 $($2 bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -r 3 2>>$W/bench.err | grep -E 'pp512' | cut -d'|' -f4,5 | tr '\n' ' ')"; }
{ bn m1 $M; bn m2 $B; bn m2 $B; bn m1 $M; echo "at $(el)"; } > $W/det.txt 2>&1; cat $W/det.txt >> $R; cat $W/det.txt; tail -3 $W/bench.err
echo "total $(el)"
