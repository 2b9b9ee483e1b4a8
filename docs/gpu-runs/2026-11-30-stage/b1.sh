#!/usr/bin/env bash
# Call b1: the full benchmark on main as of 6a22166 (binary v3): scripts/gpu_bench.sh's prepare phase
# (gpu-check on gemma3-270m and the 8B Q4_K_M, the synthetic files, llama-bench unpacked from the
# flash session's CUDA build), then its bench phase on the three 8B files, pp4096 at 512- and 4096-row
# micro-batches. The 27B is not run: its file takes 7 minutes to write, and writing it beside the 8B
# runs would load the host they time.
export TANDEM=.gpu/tandem-v3 WORK=/tmp/fb LLAMA_PREBUILT=.gpu/llama-build PP_UBATCH="512 4096" CHECK_8B=1
PHASE=prepare bash scripts/gpu_bench.sh > $OUT/final-prepare.log 2>&1
grep "| NO |\|exit\|sha256" $OUT/final-prepare.log | cut -c1-250
PHASE=bench bash scripts/gpu_bench.sh > $OUT/final-bench-8b.log 2>&1
mkdir -p $OUT/json && cp /tmp/fb/tandem-*.json /tmp/fb/llama-*.json $OUT/json/ 2>/dev/null
tail -3 /tmp/fb/bench.err /tmp/fb/llama.err 2>/dev/null; tail -20 $OUT/final-bench-8b.log
