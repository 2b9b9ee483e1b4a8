#!/usr/bin/env bash
# Call e3: does a bulk L2 prefetch make a matvec faster in isolation (cold / prefetched / hot), and
# what do the prefetch branches cost in the graph with almost nothing to fetch (1 MB) or a lot (64 MB)?
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-e3
( $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) &
timeout 200 $N gpu-check --bench-prefetch > $OUT/bench-prefetch.md 2>&1; echo "bench exit $? $(date +%T)"
wait
tg() { local l=$1 f=$2; shift 2; echo "$l $f $(env "$@" $N bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
tg off q4 TANDEM_CUDA_PREFETCH_MB=0; tg p1 q4 TANDEM_CUDA_PREFETCH_MB=1; tg p64 q4 TANDEM_CUDA_PREFETCH_MB=64
tg p64 q4 TANDEM_CUDA_PREFETCH_MB=64; tg p1 q4 TANDEM_CUDA_PREFETCH_MB=1; tg off q4 TANDEM_CUDA_PREFETCH_MB=0
} > $OUT/tg.txt 2>&1
grep -i "prefetch\|fail\|NO" $OUT/bench-prefetch.md | head -20; cat $OUT/tg.txt; grep -i "capture\|error" $OUT/bench.err | sort | uniq -c | head -5
