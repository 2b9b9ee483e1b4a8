#!/usr/bin/env bash
# Owed GPU checks for commit 5889a6f: gpu-check on synthetic gemma3-270m and smollm2-135m, the cuda
# unit tests, the serving check.
set -uo pipefail
source scripts/gpu_env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export TANDEM_KERNEL_CACHE=/tmp/kc
T=.gpu/tandem
$T synth --arch gemma3 --shape gemma3-270m --quant q4_k_m --seed 1 -o /tmp/g.gguf 2>&1 | tail -1
$T synth --arch llama --shape smollm2-135m --quant q4_k_m --seed 1 -o /tmp/s.gguf 2>&1 | tail -1
echo "== cuda unit tests"; timeout 200 .gpu/cuda-tests 2>&1 | tail -8
echo "== gpu-check"; timeout 300 $T gpu-check -m /tmp/g.gguf -m /tmp/s.gguf > $OUT/gpu-check.txt 2>&1; echo "rc=$?"; tail -40 $OUT/gpu-check.txt
echo "== serve check"; timeout 240 bash scripts/gpu_serve_check.sh /tmp/g.gguf > $OUT/serve-check.txt 2>&1; echo "rc=$?"; tail -25 $OUT/serve-check.txt
