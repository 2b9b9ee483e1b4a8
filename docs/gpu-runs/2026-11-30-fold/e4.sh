#!/usr/bin/env bash
# Call e4: p2 = p1 with `l2_prefetch` as line prefetches over a wide grid (512 bytes a thread: 32
# blocks for 4 MB) instead of 16 KB bulk prefetches from a few blocks; tg128 on the 8B Q4_K_M at 0 8
# 16 4 4 16 8 0 MB a window. a2 (tile attention at 256 threads, branch exp/attn-warps) against m1
# again, m1 a2 a2 m1, and gpu-check a2 on gemma3-270m and the 8B Q4_K_M.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
P2=.gpu/tandem-p2; A2=.gpu/tandem-a2; M1=.gpu/tandem-m1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $A2 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) & PG=$!
$P2 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; wait $PG; echo "synth done $(el)"
tp() { echo "p2 mb=$1 q4 $(TANDEM_CUDA_PREFETCH_MB=$1 $P2 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
tg() { echo "$1 q4 $($2 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for mb in 0 8 16 4 4 16 8 0; do tp $mb; done; echo "at $(el)"; tg m1 $M1; tg a2 $A2; tg a2 $A2; tg m1 $M1; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt >> $R; cat $W/tg.txt
timeout 150 $A2 gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
timeout 200 $A2 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
for c in g 8b; do echo "== check-$c"; grep "| NO |" $OUT/check-$c.md | cut -c1-300; grep -c "| yes |" $OUT/check-$c.md; grep "sha256\|greedy\|replay" $OUT/check-$c.md | cut -c1-260; done
tail -3 $W/bench.err; echo "total $(el)"
