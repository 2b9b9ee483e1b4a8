#!/usr/bin/env bash
# Call g5: m1 = main plus the tensor-core integer kernels (`mmq_q4_k`, `mmq_q6_k`) for chunks of 16 or
# more rows on the integer route (deterministic prefill). gpu-check on the 8B Q4_K_M (the new rows:
# tensor-core bits = split-1 batched matvec bits; the deterministic hash e0cf7d15d85e... across chunk
# sizes 1, 64 and 512, where 64 and 512 now take the tensor cores). Then pp512 and tg128 with
# --deterministic, h1 (before) against m1, A B B A; and m1 in the default mode.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m1; H=.gpu/tandem-h1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 200 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-400; grep -c "| yes |" $OUT/check-8b.md; grep "tensor cores\|sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-300; tail -3 $W/check-8b.err
bn() { echo "$1 $($2 bench -m $W/q4.gguf --device cuda $3 -p 512 -n 128 -r 3 2>>$W/bench.err | grep -E 'pp512|tg128' | cut -d'|' -f4,5 | tr '\n' ' ')"; }
{ bn "h1 det" $H --deterministic; bn "m1 det" $B --deterministic; bn "m1 det" $B --deterministic; bn "h1 det" $H --deterministic; bn "m1 default" $B ""; echo "at $(el)"; } > $W/det.txt 2>&1; cat $W/det.txt >> $R; cat $W/det.txt; tail -3 $W/bench.err
echo "total $(el)"
