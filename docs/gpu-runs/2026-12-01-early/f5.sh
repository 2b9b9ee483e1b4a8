#!/usr/bin/env bash
# Call f5: `tandem serve --device cuda` end to end on main as landed (9109f9f, binary f5: the chunk
# kernel's publication of call f4, which serving's batched decode steps take):
# scripts/gpu_serve_check.sh on gemma3-270m and on the 8B Q4_K_M (both modes: batched requests, a lone
# request against the batch, two-turn prefix reuse, a follow-up past the sliding window).
T0=$(date +%s); W=/tmp/t; mkdir -p $W/bin
el() { echo "$(( $(date +%s)-T0 )) s"; }
gunzip -c .gpu/f/tandem-f5.gz > $W/bin/f5; chmod +x $W/bin/f5; export TANDEM=$W/bin/f5
$TANDEM synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
$TANDEM synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf > $W/s4.log 2>&1 &
WORK=$W/sg bash scripts/gpu_serve_check.sh $W/g.gguf > $OUT/serve-check-g.txt 2>&1; echo "gemma exit $? $(el)"
wait; WORK=$W/s8 bash scripts/gpu_serve_check.sh $W/q4.gguf > $OUT/serve-check-8b.txt 2>&1; echo "8b exit $? $(el)"
tail -14 $OUT/serve-check-g.txt; tail -14 $OUT/serve-check-8b.txt
