#!/usr/bin/env bash
# Call 2 (same warm machine when possible; rebuilds whatever is missing): checks, then every expert
# in host memory against llama.cpp -ncmoe 99 at 1k-8k, the all walk at 2k, decode cpu and auto.
set -uo pipefail
export WORK=$PWD/.gpu-bin/w SLICE=qwen3-30b-a3b
echo "commit $(cat .gpu/COMMIT)"
CHECK_QUANTS="q4_k_m" CHECKS=1 RESIDENT=0 OFFLOAD=1 PP_LENS="1024 2048 4096 8192" ALL_LENS=2048 DECODE_SIDES="cpu auto" \
  bash scripts/gpu_moe_bench.sh 2>&1 | tee $OUT/offload.md
cp $WORK/check.md $WORK/check.err $OUT/ 2>/dev/null
cp $WORK/tandem-*.json $WORK/llama-*.json $OUT/ 2>/dev/null
echo "== $(date +%T) end"
