#!/usr/bin/env bash
# Call a2: the tile attention kernel per head size. A (0a70f25: head size a template parameter, the
# same sums) and B (ac56961 on exp/attn-lanes: eight lanes a key's dot, eight warps of 16 keys, a new
# summation order) against s0 (49627fd). gpu-check (new: the tile kernel against f64 for d32-d256,
# NaN-poisoned rows, queries alone against batched): A and B on gemma3-270m (7aab7b67ac6e… expected
# for A) and the 8B Q4_K_M (f88ec5d895f7… at 600 for A). tg128 A B B A on Q4_K_M and Q8_0; the
# kernel timeline of each on Q4_K_M.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
S=.gpu/tandem-s0; A=.gpu/tandem-a; B=.gpu/tandem-b
( $S synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) &
( $S synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$S synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 120 $A gpu-check -m $W/g.gguf > $OUT/check-g-a.md 2>$OUT/check-g-a.err; echo "check g a exit $? $(date +%T)"
timeout 120 $B gpu-check -m $W/g.gguf > $OUT/check-g-b.md 2>$OUT/check-g-b.err; echo "check g b exit $? $(date +%T)"
wait; echo "synth done $(date +%T)"
timeout 150 $A gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-q4-a.md 2>$OUT/check-q4-a.err; echo "check q4 a exit $? $(date +%T)"
timeout 150 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-q4-b.md 2>$OUT/check-q4-b.err; echo "check q4 b exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
tg s0 $S q4; tg a $A q4; tg b $B q4; tg b $B q4; tg a $A q4; tg s0 $S q4
tg s0 $S q8; tg a $A q8; tg b $B q8; tg b $B q8; tg a $A q8; tg s0 $S q8
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
for b in a b; do bin=.gpu/tandem-$b; TANDEM_CUDA_TRACE=$W/trace-$b.tsv timeout 60 $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$OUT/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace-$b.tsv > $OUT/timeline-$b.md 2>&1; done
for f in check-g-a check-g-b check-q4-a check-q4-b; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-200; grep -c "| yes |" $OUT/$f.md; grep "tile attention\|sha256\|greedy\|replay" $OUT/$f.md | cut -c1-220; done
for b in a b; do echo "== timeline $b"; head -8 $OUT/timeline-$b.md | cut -c1-110; done
cat $OUT/tg.txt
