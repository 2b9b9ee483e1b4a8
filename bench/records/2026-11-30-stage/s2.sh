#!/usr/bin/env bash
# Call s2: v3 = main (8518dee) plus `mmq_q8_0` reading its activations from tiles staged in shared
# memory (`mmq8_stage`: up to eight blocks of one chain a tile, the next tile copied while the block
# folds this one). gpu-check v3 on the 8B Q8_0 (the tensor-core row bit-equal with the split-1 batched
# matvec; the hash 32cce41002be... across chunk sizes 1, 64, 512) and on gemma3-270m (Q8_0 matrices;
# hash 3503891a7783...); deterministic pp512 on the 8B Q8_0, v2 (= main's kernels) v3 v3 v2.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-v2; B=.gpu/tandem-v3; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf > $W/synth8.log 2>&1 &
SP=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 200 $B gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
grep "| NO |" $OUT/check-g.md | cut -c1-400; grep -c "| yes |" $OUT/check-g.md; grep "tensor cores\|sha256" $OUT/check-g.md | cut -c1-300; tail -2 $W/check-g.err
wait $SP; tail -1 $W/synth8.log; echo "synth q8 done $(el)"
pp() { echo "$1 $($2 bench -m $W/q8.gguf --device cuda --deterministic -p 512 -n 0 -r 2 2>>$W/bench.err | grep pp512 | cut -d'|' -f5)"; }
{ pp v2 $A; pp v3 $B; } > $R 2>&1; cat $R
timeout 200 $B gpu-check -m $W/q8.gguf --hash-prompt 600 > $OUT/check-q8.md 2>$W/check-q8.err; echo "check q8 exit $? $(el)"
grep "| NO |" $OUT/check-q8.md | cut -c1-400; grep -c "| yes |" $OUT/check-q8.md; grep "tensor cores\|sha256\|greedy" $OUT/check-q8.md | cut -c1-300; tail -2 $W/check-q8.err
{ pp v3 $B; pp v2 $A; echo "at $(el)"; } >> $R 2>&1; tail -3 $R; tail -3 $W/bench.err
echo "total $(el)"
