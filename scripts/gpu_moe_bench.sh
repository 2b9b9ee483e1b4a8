#!/usr/bin/env bash
# On the GPU machine, in one run, for a mixture of experts with every expert resident: the checks
# (the kernel tests, tandem-cuda's unit tests that need a GPU, `tandem gpu-check` on tiny qwen3moe
# files and the 4-layer Qwen3-30B-A3B slice), then `tandem bench --device cuda` against llama.cpp's
# `llama-bench -ngl 99 -fa 1` on the SLICE shape at Q4_K_M, in the order A B B A, and a table last
# (each side's runs and the ratio of the medians). llama.cpp is built while the checks run
# (`scripts/llamacpp_cuda_build.sh`: LLAMA_PREBUILT and SAVE_LLAMA_BUILD work as there).
#
#   bash scripts/gpu_moe_bench.sh
#
# Environment: TANDEM (default .gpu/tandem), KERNEL_TESTS (default .gpu/kernels: the executable
# `cargo test --release -p tandem-cuda --test kernels --no-run` names), UNIT_TESTS (default
# .gpu/cuda-unit: `cargo test --release -p tandem-cuda --lib --no-run`'s), LLAMA_SDIST, WORK,
# SLICE (default qwen3-30b-a3b-16l), CHECKS=0 (benchmarks only), REPS (tandem's runs a side, 3).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${TANDEM:-.gpu/tandem}
KT=${KERNEL_TESTS:-.gpu/kernels}
UT=${UNIT_TESTS:-.gpu/cuda-unit}
W=${WORK:-/tmp/tandem-moe}
SLICE=${SLICE:-qwen3-30b-a3b-16l}
REPS=${REPS:-3}
mkdir -p "$W"
source scripts/gpu_env.sh >/dev/null
export TANDEM_KERNEL_CACHE="$W/kernels"
stamp() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

WORK="$W" bash scripts/llamacpp_cuda_build.sh &
build=$!
# The benchmark file is written while the checks run.
"$B" synth --arch qwen3moe --shape "$SLICE" --quant q4_k_m --seed 1 -o "$W/slice.gguf.tmp" >"$W/synth.log" 2>&1 &&
  mv "$W/slice.gguf.tmp" "$W/slice.gguf" &
synth=$!

if [ "${CHECKS:-1}" = 1 ]; then
  stamp "checks"
  for q in f32 q8_0 q4_k_m; do
    "$B" synth --arch qwen3moe --shape qwen3-moe-tiny --quant "$q" --seed 1 -o "$W/moe-$q.gguf" 2>&1 | tail -1
  done
  "$B" synth --arch qwen3moe --shape qwen3-moe-tiny --quant q4_k_m --route-skew 1 --seed 2 -o "$W/moe-skew.gguf" 2>&1 | tail -1
  "$B" synth --arch qwen3moe --shape qwen3-30b-a3b-4l --quant q4_k_m --seed 1 -o "$W/q30-4l.gguf" 2>&1 | tail -1
  if [ -x "$KT" ]; then
    timeout 240 "$KT" --nocapture --test-threads 1 >"$W/kernels.md" 2>&1
    echo "kernel tests exit $?" >>"$W/kernels.md"
  fi
  if [ -x "$UT" ]; then
    # Less the NVRTC compile test, which CI runs (a minute and a half of one core).
    timeout 120 "$UT" --test-threads 1 --skip every_kernel_file_compiles_for_hopper >"$W/unit.md" 2>&1
    echo "unit tests exit $?" >>"$W/unit.md"
  fi
  timeout 300 "$B" gpu-check -m "$W/moe-f32.gguf" -m "$W/moe-q8_0.gguf" -m "$W/moe-q4_k_m.gguf" -m "$W/moe-skew.gguf" \
    -m "$W/q30-4l.gguf" --prompt 600 --hash-prompt 300 >"$W/check.md" 2>"$W/check.err"
  echo "gpu-check exit $?" >>"$W/check.md"
  grep -E "^test result|FAILED|panicked|exit" "$W/kernels.md" "$W/unit.md" 2>/dev/null
  grep -E "\| (no|NO) \||exit" "$W/check.md"
fi

stamp "waiting for the slice and llama.cpp"
wait "$synth"
wait "$build"
cat "$W/build.status"
lb="$W/lcb/bin/llama-bench"
export LD_LIBRARY_PATH="$W/lcb/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -x "$lb" ] || tail -20 "$W/build.log" "$W/cmake.log" 2>/dev/null

stamp "benchmarks"
tandem_run() {
  "$B" bench -m "$W/slice.gguf" --device cuda -p 512 -n 128 -r "$REPS" --output-format json >"$W/tandem-$1.json" 2>>"$W/bench.err"
}
llama_run() {
  [ -x "$lb" ] || return
  "$lb" -m "$W/slice.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json >"$W/llama-$1.json" 2>>"$W/llama.err"
}
tandem_run 1
llama_run 1
llama_run 2
tandem_run 2
stamp "done"

python3 - "$W" "$SLICE" <<'PY'
import json, statistics, sys
w, slice_ = sys.argv[1], sys.argv[2]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return []
ours, theirs = {}, {}
for r in (1, 2):
    for row in load(f"{w}/tandem-{r}.json"):
        ours.setdefault(row["test"], []).append(row["tok_s"])
    for row in load(f"{w}/llama-{r}.json"):
        test = f"pp{row['n_prompt']}" if row.get("n_gen", 0) == 0 else f"tg{row['n_gen']}"
        theirs.setdefault(test, []).append(row.get("avg_ts"))
print(f"\n| file | test | tandem tok/s (runs) | llama.cpp tok/s (runs) | ratio of medians |")
print("|---|---|---|---|---:|")
for test in ["pp512", "tg128"]:
    a, b = ours.get(test, []), theirs.get(test, [])
    ma = statistics.median(a) if a else None
    mb = statistics.median(b) if b else None
    ratio = f"{ma / mb:.2f}x" if ma and mb else "-"
    fa = " / ".join(f"{v:,.0f}" for v in a) or "-"
    fb = " / ".join(f"{v:,.0f}" for v in b) or "-"
    print(f"| {slice_} Q4_K_M | {test} | {fa} | {fb} | {ratio} |")
PY
