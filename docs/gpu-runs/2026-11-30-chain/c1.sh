#!/usr/bin/env bash
# Call c1: the greedy chain (binary c1: tokens picked on the GPU, the next step queued before the host
# reads the token). scripts/gpu_bench.sh's prepare phase (gpu-check on gemma3-270m and the 8B Q4_K_M,
# with the pick kernel's checks and the chain against host-fed decoding), then its bench phase on the
# three 8B files (tg128 greedy and given, pp4096 at 4096-row micro-batches), and on the Q4_K_M main's
# binary (v3, host-fed tg) beside it in order and reverse.
export TANDEM=.gpu/tandem-c1 WORK=/tmp/fb LLAMA_PREBUILT=.gpu/llama-build PP_UBATCH="4096" CHECK_8B=1
PHASE=prepare bash scripts/gpu_bench.sh > $OUT/prepare.log 2>&1
grep "| NO |\|exit\|sha256\|chain\|pick" $OUT/prepare.log | cut -c1-300
EXTRA_TG="main:.gpu/tandem-v3:" EXTRA_QUANTS=q4_k_m PHASE=bench bash scripts/gpu_bench.sh > $OUT/bench.log 2>&1
mkdir -p $OUT/json && cp /tmp/fb/tandem-*.json /tmp/fb/llama-*.json /tmp/fb/extra-*.json $OUT/json/ 2>/dev/null
tail -3 /tmp/fb/bench.err /tmp/fb/llama.err 2>/dev/null; tail -22 $OUT/bench.log
