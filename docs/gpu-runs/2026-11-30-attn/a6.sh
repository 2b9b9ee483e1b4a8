#!/usr/bin/env bash
# Call a6 (the session's last minutes): h (a90ca33 on exp/attn-alone: a one-tile span of a one-head
# group finishes in its block, no partial record, fence, atomic or merge reads) against g (c09da2e,
# main). gpu-check h on gemma3-270m (heads of 256: its Q8_K groups are one head) and the 8B Q8_0 (Q8
# groups of one head; hash 02d3718e0fea… expected at 600); tg128 g h h g on Q8_0.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
G=.gpu/tandem-g; H=.gpu/tandem-h
( $G synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
$G synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 70 $H gpu-check -m $W/g.gguf > $OUT/check-g-h.md 2>$OUT/check-g-h.err; echo "check g h exit $? $(date +%T)"
wait $P8; echo "synth done $(( $(date +%s)-T0 )) s"
timeout 80 $H gpu-check -m $W/q8.gguf --hash-prompt 600 > $OUT/check-q8-h.md 2>$OUT/check-q8-h.err; echo "check q8 h exit $? $(( $(date +%s)-T0 )) s"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg g $G q8; tg h $H q8; tg h $H q8; tg g $G q8; } > $OUT/tg.txt 2>&1
for f in check-g-h check-q8-h; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-200; grep -c "| yes |" $OUT/$f.md; grep "tile attention\|sha256\|greedy\|replay" $OUT/$f.md | cut -c1-200; done
cat $OUT/tg.txt; echo "total $(( $(date +%s)-T0 )) s"
