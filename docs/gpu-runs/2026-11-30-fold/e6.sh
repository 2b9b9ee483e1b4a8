#!/usr/bin/env bash
# Call e6: wP = n1 (main after this session) with each one-row matvec asking L2 for the P steps of
# weight loads after its issued one before its wait (`prefetch_ahead` in mmvq.cu, MMVQ_PREWAIT = P):
# bytes in flight while add + norm or attention runs, with no register held. tg128 on the 8B Q4_K_M
# n1 w1 w3 w6 w6 w3 w1 n1 and on the Q8_0 n1 w3 w3 n1; gpu-check w3 on the Q4_K_M (hash e0cf7d15d85e...).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( .gpu/tandem-n1 synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
.gpu/tandem-n1 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; wait $P8; echo "synth done $(el)"
tg() { echo "$1 $2 $(.gpu/tandem-$1 bench -m $W/$2.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for b in n1 w1 w3 w6 w6 w3 w1 n1; do tg $b q4; done; echo "at $(el)"; for b in n1 w3 w3 n1; do tg $b q8; done; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt >> $R; cat $W/tg.txt
timeout 150 .gpu/tandem-w3 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-300; grep -c "| yes |" $OUT/check-8b.md; grep "sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-260
tail -2 $W/bench.err; echo "total $(el)"
