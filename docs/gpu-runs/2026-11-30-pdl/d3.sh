#!/usr/bin/env bash
# Call 3: in-graph tg128 with the matvec variants forced (TANDEM_CUDA_MMVQ) on n2: does a persistent
# kernel (resident d/r, staged p) win inside a PDL graph where the standalone timing says no?
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-n2
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
TANDEM_CUDA_MMVQ=u2r1s1d $N bench -v -m $W/q4.gguf --device cuda -p 0 -n 1 -r 1 2>&1 | grep "decode kernel" > $OUT/choices-d.txt
tg() { local l=$1; shift; echo "$l $(env "$@" $N bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for i in 1 2; do
  tg T X=1; tg D TANDEM_CUDA_MMVQ=u2r1s1d; tg R TANDEM_CUDA_MMVQ=u2r1s1r; tg P TANDEM_CUDA_MMVQ=u2r1s1p; tg D0 TANDEM_CUDA_MMVQ=u2r1s1d TANDEM_CUDA_PDL=0; tg T0 TANDEM_CUDA_PDL=0
  tg T0 TANDEM_CUDA_PDL=0; tg D0 TANDEM_CUDA_MMVQ=u2r1s1d TANDEM_CUDA_PDL=0; tg P TANDEM_CUDA_MMVQ=u2r1s1p; tg R TANDEM_CUDA_MMVQ=u2r1s1r; tg D TANDEM_CUDA_MMVQ=u2r1s1d; tg T X=1
done; } > $OUT/tg.txt 2>&1
cat $OUT/choices-d.txt; sort -s -k1,1 $OUT/tg.txt
