#!/usr/bin/env bash
# Call e7: f1 = n1 with the residual add and next pre-norm as the tail of the o and down projections'
# matvecs (`norm_tail` in mmvq.cu: the last block to finish does add_norm_to's work in its order;
# branch exp/norm-tail). tg128 on the 8B Q4_K_M f1 with TANDEM_CUDA_FOLD=0 (off) and on, off on on off;
# then gpu-check f1 (chunks of one row take the tail, 64 and 512 add_norm_to: the hash e0cf7d15d85e...
# must hold across them).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
F1=.gpu/tandem-f1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$F1 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
tg() { echo "fold=$1 q4 $(TANDEM_CUDA_FOLD=$1 $F1 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg 0; tg 1; tg 1; tg 0; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; tail -3 $W/bench.err
timeout 130 $F1 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-300; grep -c "| yes |" $OUT/check-8b.md; grep "sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-260; tail -3 $W/check-8b.err
echo "total $(el)"
