#!/usr/bin/env bash
# Call e6: the tied output head (Gemma) on the integer route. gpu-check on gemma3-270m (greedy vs CPU,
# graph replay, deterministic chunkings), then tg128 A B B A against e4.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-e6; B=.gpu/tandem-e4
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 100 $N gpu-check -m $W/g.gguf > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
tg() { echo "$1 g $($2 bench -m $W/g.gguf --device cuda -p 0 -n 128 -r 3 -v 2>>$OUT/bench-$1.err | grep tg128 | cut -d'|' -f5)"; }
{ tg e6 $N; tg e4 $B; tg e4 $B; tg e6 $N; } > $OUT/tg.txt 2>&1
grep "| NO |" $OUT/check.md | cut -c1-200; grep -c "| yes |" $OUT/check.md
grep "g.gguf" $OUT/check.md | cut -c1-230; cat $OUT/tg.txt; grep "tied\|262144" $OUT/bench-e6.err | head -3; grep "262144" $OUT/bench-e4.err | head -2
