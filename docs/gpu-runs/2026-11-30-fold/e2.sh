#!/usr/bin/env bash
# Call e2: a5 = main (m1) with the tile attention kernels at 512 threads (16 warps of 8 keys, four
# lanes a key's dot; a new summation order, so new deterministic hashes), a2 = the same at 256 threads
# (8 warps of 16 keys, two lanes a key). gpu-check a5 on gemma3-270m (head size 256, QK-norm,
# sliding window) and the 8B Q4_K_M (hashes must agree across chunk sizes 1, 64, 512); tg128 m1 a5 a2
# a2 a5 m1 on the 8B Q4_K_M and m1 a5 a5 m1 on gemma3-270m; a5's timeline on the 8B.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
M1=.gpu/tandem-m1; A5=.gpu/tandem-a5; A2=.gpu/tandem-a2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $A5 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) & PG=$!
$A5 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; wait $PG; echo "synth done $(el)"
timeout 200 $A5 gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
timeout 200 $A5 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
for c in g 8b; do echo "== check-$c"; grep "| NO |" $OUT/check-$c.md | cut -c1-300; grep -c "| yes |" $OUT/check-$c.md; grep "sha256\|greedy\|replay" $OUT/check-$c.md | cut -c1-260; done
tg() { echo "$1 $2 $($3 bench -m $W/$2.gguf --device cuda -p 0 -n 128 -r $4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg m1 q4 $M1 6; tg a5 q4 $A5 6; tg a2 q4 $A2 6; tg a2 q4 $A2 6; tg a5 q4 $A5 6; tg m1 q4 $M1 6; echo "at $(el)"
  tg m1 g $M1 6; tg a5 g $A5 6; tg a5 g $A5 6; tg m1 g $M1 6; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt >> $R
TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $A5 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv --sequence 12 > $OUT/timeline-a5.md 2>&1
head -16 $OUT/timeline-a5.md | cut -c1-110; cat $W/tg.txt; tail -3 $W/bench.err; echo "total $(el)"
