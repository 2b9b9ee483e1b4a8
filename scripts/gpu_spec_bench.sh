#!/usr/bin/env bash
# On the GPU machine, in one run: speculative decoding on the 8B shape (synthetic Q4_K_M).
# 1. Greedy identity: `tandem run --spec off|lookup` on bench/spec/code.txt, with and without
#    --deterministic (the identity is promised under --deterministic; the other row says whether the
#    default routes keep it too).
# 2. What a verify pass costs: `tandem bench -p 2,3,5,9,17 -u 32 -n 32 -d 1024` (a k+1-row pass against
#    tg, at a depth), both modes.
# 3. `scripts/spec_bench.py` on the three texts against llama.cpp's llama-lookup built in the same call
#    (`scripts/llamacpp_cuda_build.sh` with LLAMA_TARGETS=llama-lookup), `-ngl 99 -fa on`.
# Tables last.
#
#   bash scripts/gpu_spec_bench.sh
#
# Environment: TANDEM (default .gpu/tandem), WORK (default /tmp/tandem-spec), ROUNDS (spec_bench.py
# --rounds, default 2), LLAMA=0 (no llama.cpp build: steps 1 and 2 only).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${TANDEM:-.gpu/tandem}
W=${WORK:-/tmp/tandem-spec}
mkdir -p "$W"
source scripts/gpu_env.sh >/dev/null
export TANDEM_KERNEL_CACHE="$W/kernels"
stamp() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
build=""
if [ "${LLAMA:-1}" = 1 ]; then
  WORK="$W" LLAMA_TARGETS="llama-lookup" bash scripts/llamacpp_cuda_build.sh &
  build=$!
fi
M=$W/llama3-8b-q4_k_m.gguf
[ -s "$M" ] || "$B" synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o "$M" 2>&1 | tail -1

stamp "greedy identity"
for det in "--deterministic" ""; do
  for arm in off lookup; do
    "$B" run -m "$M" --device cuda $det -n 96 --prompt-file bench/spec/code.txt --spec $arm \
      --output-format json 2>"$W/run-$arm$det.err" |
      python3 -c "import json,sys; print(json.load(sys.stdin)['completion_ids'])" >"$W/ids-$arm$det.txt"
    tail -1 "$W/run-$arm$det.err"
  done
  if cmp -s "$W/ids-off$det.txt" "$W/ids-lookup$det.txt"; then same=same; else same=DIFFERENT; fi
  echo "identity (${det:-default routes}): $same"
done

stamp "verify pass costs"
for det in "--deterministic" ""; do
  "$B" bench -m "$M" --device cuda $det -p 2,3,5,9,17 -u 32 -n 32 -d 1024 -r 3 2>&1
done

if [ -n "$build" ]; then
  stamp "wait for llama.cpp"
  wait "$build"
  cat "$W/build.status"
  stamp "spec_bench"
  python3 scripts/spec_bench.py --tandem "$B" --tandem-args "--device cuda" --llama-bin "$W/lcb/bin" \
    --llama-args "-ngl 99 -fa on" --model llama3-8b=$M --text bench/spec/code.txt \
    --text bench/spec/licence.txt --text bench/spec/story.txt --threads 16 --rounds "${ROUNDS:-2}" \
    --json "$W/spec_bench.json" 2>"$W/spec_bench.log"
fi
stamp "end"
