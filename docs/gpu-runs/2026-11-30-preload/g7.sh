#!/usr/bin/env bash
# Call g7: m3 = m2 with the tensor-core kernels' merge partials in shared memory and each Q4_K chunk's
# products folded right after its two mmas (110 and 128 registers against 172 and 168: four blocks an
# SM where there were three). gpu-check m3 on the 8B Q4_K_M; the op profile of a deterministic pp512;
# then deterministic pp512 m2 against m3, A B B A, and m3's tg128 in both modes.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m3; M=.gpu/tandem-m2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 200 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-400; grep -c "| yes |" $OUT/check-8b.md; grep "tensor cores\|sha256" $OUT/check-8b.md | cut -c1-300; tail -2 $W/check-8b.err
TANDEM_CUDA_PROFILE=1 $B bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -r 1 > $W/prof.out 2> $OUT/profile-det-pp512.txt; head -12 $OUT/profile-det-pp512.txt
bn() { echo "$1 $($2 bench -m $W/q4.gguf --device cuda $3 -p $4 -n $5 -r 3 2>>$W/bench.err | grep -E 'pp512|tg128' | cut -d'|' -f4,5 | tr '\n' ' ')"; }
{ bn m2 $M --deterministic 512 0; bn m3 $B --deterministic 512 0; bn m3 $B --deterministic 512 0; bn m2 $M --deterministic 512 0; bn "m3 det" $B --deterministic 0 128; bn "m3 default" $B "" 512 128; echo "at $(el)"; } > $W/det.txt 2>&1; cat $W/det.txt >> $R; cat $W/det.txt; tail -3 $W/bench.err
echo "total $(el)"
