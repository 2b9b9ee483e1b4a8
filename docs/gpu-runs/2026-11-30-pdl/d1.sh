#!/usr/bin/env bash
# Session 2026-11-30b call 1: exp/pdl-weights (p1) checked and timed against itself without PDL and g5.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-p1; B=.gpu/tandem-g5
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
( $N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait; echo "synth done $(date +%T)"
timeout 150 $N gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; shift 3; echo "$l $f $(env "$@" $bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
for f in q4 q8; do
tg pdl $N $f X=1; tg nopdl $N $f TANDEM_CUDA_PDL=0; tg g5 $B $f X=1
tg g5 $B $f X=1; tg nopdl $N $f TANDEM_CUDA_PDL=0; tg pdl $N $f X=1
tg pdl $N $f X=1; tg nopdl $N $f TANDEM_CUDA_PDL=0; tg g5 $B $f X=1
echo "$f done $(date +%T)"
done
} > $OUT/tg.txt 2>&1
grep -v "^| matvec Seg\|^| matvec Warp\|^| matvec Lane\|^| gemm\|^| int8\|^| add_norm\|^| gated_pair\|flash" $OUT/check.md | tail -9 | cut -c1-170
cat $OUT/tg.txt
