#!/usr/bin/env bash
# Call f4: the fused kernels without clusters (binary f4: every block makes the whole row). gpu-check (kernel checks with the
# fused kernels' bit comparison; gemma3-270m and the 8B Q4_K_M end to end, the fused path forced on
# the 8B by staged variants); then tg128 on the 8B Q4_K_M: staged variants only (TANDEM_CUDA_MMVQ),
# fusion on and off, and the free load-time choice without fusion, in order and reverse.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-f4; R=$OUT/results.txt; P="u1r1s1p,u2r1s1p,u1r2s1p,u2r2s1p,u4r1s1p"
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $PS; echo "synth $(el)"
TANDEM_CUDA_MMVQ=$P timeout 300 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(el)"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-300; grep "add + norm\|greedy\|replay\|sha256" $OUT/check.md | cut -c1-260
tail -2 $OUT/check.err
tg() { local l=$1; shift; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
{ for c in fused plain free free plain fused; do case $c in
    fused) tg fused TANDEM_CUDA_MMVQ=$P;;
    plain) tg plain TANDEM_CUDA_MMVQ=$P TANDEM_CUDA_FUSE_NORM=0;;
    free) tg free TANDEM_CUDA_FUSE_NORM=0;;
  esac; done; } | tee -a $R
TANDEM_CUDA_MMVQ=$P $B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | head -12 >> $R
echo "done $(el)"; tail -3 $W/bench.err
