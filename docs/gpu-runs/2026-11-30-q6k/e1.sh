#!/usr/bin/env bash
# Call e1: L2 prefetch branches in decode graphs. gpu-check with prefetch on (default 16 MB), then
# tg128 on Q4_K_M and Q8_0 with TANDEM_CUDA_PREFETCH_MB=0/16/32 and the full-edge variant, alternated.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-e1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv > $OUT/gpu.txt 2>&1
( $N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
echo "synth q4 done $(date +%T)"
timeout 150 $N gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
tg() { local l=$1 f=$2; shift 2; echo "$l $f $(env "$@" $N bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
tg off q4 TANDEM_CUDA_PREFETCH_MB=0; tg p16 q4 TANDEM_CUDA_PREFETCH_MB=16; tg p16full q4 TANDEM_CUDA_PREFETCH_MB=16 TANDEM_CUDA_PREFETCH_EDGE=full
tg p32 q4 TANDEM_CUDA_PREFETCH_MB=32; tg p32 q4 TANDEM_CUDA_PREFETCH_MB=32
tg p16full q4 TANDEM_CUDA_PREFETCH_MB=16 TANDEM_CUDA_PREFETCH_EDGE=full; tg p16 q4 TANDEM_CUDA_PREFETCH_MB=16; tg off q4 TANDEM_CUDA_PREFETCH_MB=0
wait; echo "synth q8 done $(date +%T)"
tg off q8 TANDEM_CUDA_PREFETCH_MB=0; tg p16 q8 TANDEM_CUDA_PREFETCH_MB=16; tg p16 q8 TANDEM_CUDA_PREFETCH_MB=16; tg off q8 TANDEM_CUDA_PREFETCH_MB=0
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
grep "| no |" $OUT/check.md | cut -c1-200; grep -c "| yes |" $OUT/check.md
grep "sha256\|greedy\|replay" $OUT/check.md | cut -c1-200
grep -i "capture\|error" $OUT/bench.err $OUT/check.err | sort | uniq -c | head
cat $OUT/gpu.txt; cat $OUT/tg.txt
