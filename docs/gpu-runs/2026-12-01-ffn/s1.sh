#!/usr/bin/env bash
# Call s1: the streamed feed-forward kernel (binary s1, TANDEM_CUDA_FFN=stream). Kernel checks alone
# first, while the models are written (the streamed kernel's bits against the chained matvecs; a
# hang stops the call there); then gpu-check with gemma3-270m (not streamed: 640 wide) and the 8B
# Q4_K_M (streamed) end to end; then tg128 on the 8B Q4_K_M, streamed and chained, s c c s.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/s/tandem-s1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 120 $B gpu-check > $OUT/kernels.md 2>$OUT/kernels.err; rc=$?; echo "kernel checks exit $rc $(el)"
grep "streamed" $OUT/kernels.md | cut -c1-220; grep "| NO |" $OUT/kernels.md | cut -c1-220; tail -2 $OUT/kernels.err
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
TANDEM_CUDA_FFN=stream timeout 300 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(el)"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-300; grep "greedy\|sha256\|replay" $OUT/check.md | cut -c1-260
tail -2 $OUT/check.err
tg() { local l=$1; shift; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
{ for c in stream chain chain stream; do case $c in
    stream) tg stream TANDEM_CUDA_FFN=stream;;
    chain) tg chain TANDEM_CUDA_FFN=chained;;
  esac; done; } | tee -a $R
$B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | grep "x14336\|14336x" >> $R
echo "done $(el)"; tail -3 $W/bench.err
