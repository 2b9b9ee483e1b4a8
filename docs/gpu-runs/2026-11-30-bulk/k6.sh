#!/usr/bin/env bash
# Call k6: main with `mmq_q8_0` (m5 = a94feeb) on the gemma3-270m shape, whose 640-wide matrices are
# Q8_0 and Q5_0: in deterministic mode its Q8_0 chunks of 16 rows or more now take the tensor cores.
# gpu-check (the deterministic hash 3503891a7783... across chunk sizes 1, 64 and 512), then
# deterministic pp512 m4 (before) against m5, A B B A, and tg128 of both in the default mode.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-m5; H=.gpu/tandem-m4; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1; echo "synth done $(el)"
timeout 200 $B gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
grep "| NO |" $OUT/check-g.md | cut -c1-400; grep -c "| yes |" $OUT/check-g.md; grep "tensor cores\|sha256\|greedy\|replay" $OUT/check-g.md | cut -c1-300; tail -2 $W/check-g.err
bn() { echo "$1 $($2 bench -m $W/g.gguf --device cuda $3 -p 512 -n 128 -r 3 2>>$W/bench.err | grep -E 'pp512|tg128' | cut -d'|' -f4,5 | tr '\n' ' ')"; }
{ bn "m4 det" $H --deterministic; bn "m5 det" $B --deterministic; bn "m5 det" $B --deterministic; bn "m4 det" $H --deterministic; bn "m5 default" $B ""; bn "m4 default" $H ""; echo "at $(el)"; } > $W/det.txt 2>&1; cat $W/det.txt >> $R; cat $W/det.txt; tail -3 $W/bench.err
echo "total $(el)"
