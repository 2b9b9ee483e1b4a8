#!/usr/bin/env bash
# Call g8: m3 (the tensor-core integer kernels) on the gemma3-270m shape: gpu-check (the deterministic
# hash 3503891a7783... across chunk sizes 1, 64 and 512, where 64 and 512 now take the tensor cores for
# its Q4_K and Q6_K matrices), then deterministic pp512 h1 against m3, A B B A.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m3; H=.gpu/tandem-h1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1; echo "synth done $(el)"
$B bench -m $W/g.gguf --device cuda --deterministic -p 512 -n 0 -r 1 -v 2>&1 | grep "decode kernel" > $OUT/choices-g-det.txt
timeout 200 $B gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
grep "| NO |" $OUT/check-g.md | cut -c1-400; grep -c "| yes |" $OUT/check-g.md; grep "tensor cores\|sha256\|greedy\|replay" $OUT/check-g.md | cut -c1-300; tail -2 $W/check-g.err
bn() { echo "$1 $($2 bench -m $W/g.gguf --device cuda --deterministic -p 512 -n 0 -r 3 2>>$W/bench.err | grep -E 'pp512' | cut -d'|' -f4,5 | tr '\n' ' ')"; }
{ bn h1 $H; bn m3 $B; bn m3 $B; bn h1 $H; echo "at $(el)"; } > $W/det.txt 2>&1; cat $W/det.txt >> $R; cat $W/det.txt; tail -3 $W/bench.err
echo "total $(el)"
