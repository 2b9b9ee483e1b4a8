#!/usr/bin/env bash
# Call 1: llama.cpp (bench, lookup, speculative-simple) built and saved; the 48-layer file; link probe;
# follow-up turns; resident table.
set -uo pipefail
export WORK=$PWD/.gpu-bin/w SLICE=qwen3-30b-a3b
W=$WORK; mkdir -p $W
source scripts/gpu_env.sh >/dev/null
export TANDEM_KERNEL_CACHE="$W/kernels"
echo "commit $(cat .gpu/COMMIT)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
LLAMA_TARGETS="llama-bench llama-lookup llama-speculative-simple" BUILD_JOBS=14 \
  bash scripts/llamacpp_cuda_build.sh & build=$!
( .gpu/tandem synth --arch qwen3moe --shape $SLICE --quant q4_k_m --seed 1 -o $W/s.tmp > $W/synth.log 2>&1 && mv $W/s.tmp $W/slice-$SLICE.gguf ) & synth=$!
.gpu/tandem-dev bench link 2>&1 | tee $OUT/link.txt
wait $synth; ls -la $W/slice-$SLICE.gguf; tail -2 $W/synth.log
echo "== $(date +%T) follow-up"
python3 scripts/moe_followup.py --tandem .gpu/tandem --model $W/slice-$SLICE.gguf --first 8192 32768 --new 512 \
  --log $OUT/followup-serve.log --timeout 400 -- --device cuda --gpu-expert-budget 0 --prefill-chunk 8192 --kv-budget 16G 2>&1 | tee $OUT/followup.md
echo "== $(date +%T) wait build"; wait $build; cat $W/build.status; ls $W/lcb/bin | head -30
CHECKS=0 RESIDENT=1 OFFLOAD=0 bash scripts/gpu_moe_bench.sh 2>&1 | tee $OUT/resident.md
cp $W/tandem-*.json $W/llama-*.json $OUT/ 2>/dev/null
echo "== $(date +%T) end"
