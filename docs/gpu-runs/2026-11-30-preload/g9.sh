#!/usr/bin/env bash
# Call g9: m4 = m3 with the two tensor-core kernels written as one driver (`mmq_run`) over a per-type
# super-block step (`MmqQ4k`, `MmqQ6k`); the same expressions. gpu-check m4 on the 8B Q4_K_M (the
# tensor-core rows, the hash e0cf7d15d85e... across chunk sizes), then deterministic pp512 m3, m4.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m4; M=.gpu/tandem-m3; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 150 $B gpu-check -m $W/q4.gguf --hash-prompt 600 --gen 16 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-400; grep -c "| yes |" $OUT/check-8b.md; grep "tensor cores\|sha256" $OUT/check-8b.md | cut -c1-300; tail -2 $W/check-8b.err
bn() { echo "$1 $($2 bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -r 3 2>>$W/bench.err | grep -E 'pp512' | cut -d'|' -f4,5 | tr '\n' ' ')"; }
{ bn m3 $M; bn m4 $B; echo "at $(el)"; } > $W/det.txt 2>&1; cat $W/det.txt >> $R; cat $W/det.txt; tail -3 $W/bench.err
echo "total $(el)"
