#!/usr/bin/env bash
# On the GPU machine, in one run, for a mixture of experts: the checks (the kernel tests,
# tandem-cuda's unit tests that need a GPU, `tandem gpu-check` on tiny qwen3moe files and the
# 4-layer Qwen3-30B-A3B slice, which includes the expert placements' hashes), then benchmarks on the
# SLICE shape at Q4_K_M against llama.cpp's `llama-bench -fa 1`, in the order A B B A, and a table
# last (each side's runs and the ratio of the medians):
# - RESIDENT=1: every expert on the GPU (`-ngl 99`): pp512 and tg128.
# - OFFLOAD=1: every expert in host memory (`--gpu-expert-budget 0` against `-ngl 99 --n-cpu-moe
#   99`): pp at PP_LENS (one chunk each, `-u`/`-ub` the length) and tg32; Tandem's routed and all
#   stream walks, with `--trace`'s copied and skipped experts and link rates in the log, and decode
#   with `--expert-decode gpu`, `cpu` and `auto`.
# llama.cpp is built while the checks run (`scripts/llamacpp_cuda_build.sh`: LLAMA_PREBUILT and
# SAVE_LLAMA_BUILD work as there).
#
#   bash scripts/gpu_moe_bench.sh
#
# Environment: TANDEM (default .gpu/tandem), KERNEL_TESTS (default .gpu/kernels: the executable
# `cargo test --release -p tandem-cuda --test kernels --no-run` names), UNIT_TESTS (default
# .gpu/cuda-unit: `cargo test --release -p tandem-cuda --lib --no-run`'s), LLAMA_SDIST, WORK,
# SLICE (default qwen3-30b-a3b-16l), CHECKS, RESIDENT, OFFLOAD (1 or 0; default 1, 1, 0),
# CHECK_QUANTS (the tiny files' types, default "f32 q8_0 q4_k_m"), LLAMA=0 (no llama.cpp), REPS
# (tandem's runs a side, 3), PP_LENS (default "2048 4096"), ALL_LENS (the lengths the `all` walk also
# runs, default PP_LENS), DECODE_SIDES (default "gpu cpu auto").
set -uo pipefail
cd "$(dirname "$0")/.."
B=${TANDEM:-.gpu/tandem}
KT=${KERNEL_TESTS:-.gpu/kernels}
UT=${UNIT_TESTS:-.gpu/cuda-unit}
W=${WORK:-/tmp/tandem-moe}
SLICE=${SLICE:-qwen3-30b-a3b-16l}
REPS=${REPS:-3}
PP_LENS=${PP_LENS:-"2048 4096"}
ALL_LENS=${ALL_LENS:-$PP_LENS}
DECODE_SIDES=${DECODE_SIDES:-"gpu cpu auto"}
mkdir -p "$W"
source scripts/gpu_env.sh >/dev/null
export TANDEM_KERNEL_CACHE="$W/kernels"
stamp() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

# LLAMA=0: no llama.cpp (Tandem's side of the benchmarks alone).
build=""
if [ "${LLAMA:-1}" = 1 ]; then
  WORK="$W" bash scripts/llamacpp_cuda_build.sh &
  build=$!
fi
# The benchmark file is written while the checks run (kept from an earlier call on a warm machine
# when WORK lies in an ignored folder of the repository).
if [ -s "$W/slice-$SLICE.gguf" ]; then
  true &
else
  "$B" synth --arch qwen3moe --shape "$SLICE" --quant q4_k_m --seed 1 -o "$W/slice.gguf.tmp" >"$W/synth.log" 2>&1 &&
    mv "$W/slice.gguf.tmp" "$W/slice-$SLICE.gguf" &
fi
synth=$!

if [ "${CHECKS:-1}" = 1 ]; then
  stamp "checks"
  for q in ${CHECK_QUANTS:-f32 q8_0 q4_k_m}; do
    "$B" synth --arch qwen3moe --shape qwen3-moe-tiny --quant "$q" --seed 1 -o "$W/moe-$q.gguf" 2>&1 | tail -1
    check_models="${check_models:-} -m $W/moe-$q.gguf"
  done
  "$B" synth --arch qwen3moe --shape qwen3-moe-tiny --quant q4_k_m --route-skew 1 --seed 2 -o "$W/moe-skew.gguf" 2>&1 | tail -1
  "$B" synth --arch qwen3moe --shape qwen3-30b-a3b-4l --quant q4_k_m --seed 1 -o "$W/q30-4l.gguf" 2>&1 | tail -1
  # The kernel and unit tests beside gpu-check: all three check bits, none times anything.
  (
    if [ -x "$KT" ]; then
      timeout 240 "$KT" --nocapture --test-threads 1 >"$W/kernels.md" 2>&1
      echo "kernel tests exit $?" >>"$W/kernels.md"
    fi
    if [ -x "$UT" ]; then
      # Less the NVRTC compile test, which CI runs (a minute and a half of one core).
      timeout 120 "$UT" --test-threads 1 --skip every_kernel_file_compiles_for_hopper >"$W/unit.md" 2>&1
      echo "unit tests exit $?" >>"$W/unit.md"
    fi
  ) &
  tests=$!
  # shellcheck disable=SC2086
  timeout 300 "$B" gpu-check $check_models -m "$W/moe-skew.gguf" -m "$W/q30-4l.gguf" --prompt 600 --hash-prompt 300 \
    >"$W/check.md" 2>"$W/check.err"
  echo "gpu-check exit $?" >>"$W/check.md"
  wait "$tests"
  grep -E "^test result|FAILED|panicked|exit" "$W/kernels.md" "$W/unit.md" 2>/dev/null
  grep -E "\| (no|NO) \||exit" "$W/check.md"
fi

stamp "waiting for the slice and llama.cpp"
wait "$synth"
[ -n "$build" ] && wait "$build" && cat "$W/build.status"
lb="$W/lcb/bin/llama-bench"
export LD_LIBRARY_PATH="$W/lcb/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -x "$lb" ] || tail -20 "$W/build.log" "$W/cmake.log" 2>/dev/null

stamp "benchmarks"
if [ "${RESIDENT:-1}" = 1 ]; then
  tandem_run() {
    "$B" bench -m "$W/slice-$SLICE.gguf" --device cuda -p 512 -n 128 -r "$REPS" --output-format json >"$W/tandem-$1.json" 2>>"$W/bench.err"
  }
  llama_run() {
    [ -x "$lb" ] || return
    "$lb" -m "$W/slice-$SLICE.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json >"$W/llama-$1.json" 2>>"$W/llama.err"
  }
  tandem_run 1
  llama_run 1
  llama_run 2
  tandem_run 2
fi
if [ "${OFFLOAD:-0}" = 1 ]; then
  off_tandem() {
    for mode in routed all; do
      lens=$PP_LENS
      [ "$mode" = all ] && lens=$ALL_LENS
      for n in $lens; do
        "$B" bench -m "$W/slice-$SLICE.gguf" --device cuda --gpu-expert-budget 0 --expert-stream "$mode" --trace \
          -p "$n" -n 0 -u "$n" -r 2 --output-format json >"$W/off-tandem-$mode-$n-$1.json" 2>>"$W/off-trace-$mode.log"
      done
    done
    for side in $DECODE_SIDES; do
      "$B" bench -m "$W/slice-$SLICE.gguf" --device cuda --gpu-expert-budget 0 --expert-decode "$side" --trace \
        -p 0 -n 32 -r 2 --output-format json >"$W/off-tandem-tg-$side-$1.json" 2>>"$W/off-decode-$side.log"
    done
  }
  off_llama() {
    [ -x "$lb" ] || return
    for n in $PP_LENS; do
      "$lb" -m "$W/slice-$SLICE.gguf" -ngl 99 -ncmoe 99 -fa 1 -p "$n" -n 0 -b "$n" -ub "$n" -r 2 -o json \
        >"$W/off-llama-$n-$1.json" 2>>"$W/llama.err"
    done
    "$lb" -m "$W/slice-$SLICE.gguf" -ngl 99 -ncmoe 99 -fa 1 -p 0 -n 32 -r 2 -o json >"$W/off-llama-tg-$1.json" 2>>"$W/llama.err"
  }
  off_tandem 1
  off_llama 1
  off_llama 2
  off_tandem 2
  grep -h "expert stream" "$W"/off-trace-*.log | tail -8
  grep -h "expert decode" "$W"/off-decode-auto.log | tail -2
fi
stamp "done"

python3 - "$W" "$SLICE" "$PP_LENS" <<'PY'
import glob, json, statistics, sys
w, slice_, lens = sys.argv[1], sys.argv[2], sys.argv[3].split()
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return []
def llama_test(row):
    return f"pp{row['n_prompt']}" if row.get("n_gen", 0) == 0 else f"tg{row['n_gen']}"
def line(label, test, a, b):
    ma = statistics.median(a) if a else None
    mb = statistics.median(b) if b else None
    ratio = f"{ma / mb:.2f}x" if ma and mb else "-"
    fa = " / ".join(f"{v:,.0f}" for v in a) or "-"
    fb = " / ".join(f"{v:,.0f}" for v in b) or "-"
    print(f"| {slice_} Q4_K_M | {label} | {test} | {fa} | {fb} | {ratio} |")
print("\n| file | experts | test | tandem tok/s (runs) | llama.cpp tok/s (runs) | ratio of medians |")
print("|---|---|---|---|---|---:|")
ours, theirs = {}, {}
for r in (1, 2):
    for row in load(f"{w}/tandem-{r}.json"):
        ours.setdefault(row["test"], []).append(row["tok_s"])
    for row in load(f"{w}/llama-{r}.json"):
        theirs.setdefault(llama_test(row), []).append(row.get("avg_ts"))
for test in ["pp512", "tg128"]:
    if ours.get(test) or theirs.get(test):
        line("all on the GPU (-ngl 99)", test, ours.get(test, []), theirs.get(test, []))
theirs = {}
for p in glob.glob(f"{w}/off-llama-*.json"):
    for row in load(p):
        theirs.setdefault(llama_test(row), []).append(row.get("avg_ts"))
for mode in ["routed", "all"]:
    ours = {}
    for p in glob.glob(f"{w}/off-tandem-{mode}-*.json"):
        for row in load(p):
            ours.setdefault(row["test"], []).append(row["tok_s"])
    for n in lens:
        test = f"pp{n}"
        if ours.get(test) or theirs.get(test):
            line(f"in host memory, stream {mode} (llama.cpp --n-cpu-moe 99)", test, ours.get(test, []), theirs.get(test, []))
for side, label in [("gpu", "slot cache"), ("cpu", "experts on the CPU"), ("auto", "auto")]:
    ours = {}
    for p in glob.glob(f"{w}/off-tandem-tg-{side}-*.json"):
        for row in load(p):
            ours.setdefault(row["test"], []).append(row["tok_s"])
    if ours.get("tg32") or theirs.get("tg32"):
        line(f"in host memory, decode: {label} (llama.cpp --n-cpu-moe 99)", "tg32", ours.get("tg32", []), theirs.get("tg32", []))
PY
