#!/usr/bin/env bash
# Call 4: g4 = g3 with a read-only L2 flush in the tuning (g3 overwrote a buffer: dirty lines).
# tg128 A/B on q8 and q4: g4, g4 with back-to-back tuning, g3, f1.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-g4; G=.gpu/tandem-g3; B=.gpu/tandem-f1
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait; echo "synth done $(date +%T)"
for f in q4 q8; do for c in "g4 $N X=1" "hot $N TANDEM_CUDA_TUNE_FLUSH=0" "g3 $G X=1"; do set -- $c; echo "$1 $f"; env $3 $2 bench -v -m $W/$f.gguf --device cuda -p 0 -n 1 -r 1 2>&1 | grep "decode kernel"; done; done > $OUT/choices.txt
tg() { local l=$1 bin=$2 f=$3; shift 3; echo "$l $f $(env "$@" $bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
for f in q8 q4; do
tg g4 $N $f X=1; tg hot $N $f TANDEM_CUDA_TUNE_FLUSH=0; tg g3 $G $f X=1; tg f1 $B $f X=1
tg f1 $B $f X=1; tg g3 $G $f X=1; tg hot $N $f TANDEM_CUDA_TUNE_FLUSH=0; tg g4 $N $f X=1
tg g4 $N $f X=1; tg f1 $B $f X=1; tg hot $N $f TANDEM_CUDA_TUNE_FLUSH=0; tg g4 $N $f X=1
done
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
cat $OUT/tg.txt
