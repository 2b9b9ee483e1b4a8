#!/usr/bin/env bash
# On the GPU machine, in one call of at most BUDGET seconds (default 520): speculative decoding on the
# 8B shape (synthetic Q4_K_M), tables as it goes, files under $OUT.
# 1. Greedy identity: `tandem run --spec off|lookup`, the 8B shape on bench/spec/code.txt and Gemma 3's
#    270M shape on the licence (its sliding-window rings wrap), with and without
#    --deterministic (identity is promised under --deterministic; the other line says whether the
#    default routes keep it too).
# 2. What a verify pass costs: `tandem bench -p 1,2,3,5,8,9,17 -u 32 -d 1024`, both modes.
# 3. Tandem lookup against no drafts, A B B A under --deterministic, on the three texts.
# 4. llama.cpp's llama-lookup (`--spec-draft-n-max 0|8`, `-ngl 99 -fa on`) on the same file and texts,
#    built in the background from the sdist (`scripts/llamacpp_cuda_build.sh`) while 1-3 run.
# Each step starts only while its share of BUDGET is left, so the call ends inside the device limit.
#
#   BUDGET=520 bash scripts/gpu_spec_bench.sh
#
# Environment: TANDEM (default .gpu/tandem), WORK (default .gpu-bin/w: an ignored folder, so a warm
# machine keeps the model and the llama.cpp build for the next call), BUDGET, TEXTS (step 3's texts,
# default "code story licence"), ANCHORS (0: no llama.cpp build or runs).
set -uo pipefail
cd "$(dirname "$0")/.."
export WORK=${WORK:-$PWD/.gpu-bin/w}; W=$WORK; mkdir -p "$W"
OUT=${OUT:-$W/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null
export TANDEM_KERNEL_CACHE=$W/kernels
B=${TANDEM:-.gpu/tandem}; T0=$SECONDS; BUDGET=${BUDGET:-520}
left() { [ $((SECONDS - T0)) -lt "$1" ]; }
echo "commit $(cat .gpu/COMMIT 2>/dev/null || git rev-parse --short HEAD)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
build=
[ "${ANCHORS:-1}" = 0 ] || { LLAMA_TARGETS="llama-lookup llama-bench" BUILD_JOBS=12 bash scripts/llamacpp_cuda_build.sh >/dev/null 2>&1 & build=$!; }
M=$W/8b.gguf
[ -s $M ] || $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $M 2>&1 | tail -1
G=$W/g270m.gguf
[ -s $G ] || $B synth --arch gemma3 --shape gemma3-270m --quant q4_k_m --seed 1 -o $G 2>&1 | tail -1
echo "== $(date +%T) greedy identity ($((SECONDS - T0)) s)"
# The 8B shape on code; Gemma 3's shape on the licence, whose prompt is past its 512-row window, so
# verify passes wrap the sliding-window rings and rejected drafts are cut from wrapped rings.
for case in "8b $M code" "g270m $G licence"; do
  set -- $case
  for det in "--deterministic" ""; do
    for arm in off lookup; do
      $B run -m $2 --device cuda $det -n 96 --prompt-file bench/spec/$3.txt --spec $arm --output-format json \
        2>$OUT/run-$1-$arm${det:+-det}.err | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['completion_ids']))" > $OUT/ids-$1-$arm${det:+-det}.txt
    done
    [ -s $OUT/ids-$1-off${det:+-det}.txt ] && cmp -s $OUT/ids-$1-off${det:+-det}.txt $OUT/ids-$1-lookup${det:+-det}.txt && echo "identity $1 ${det:-default}: same" || echo "identity $1 ${det:-default}: DIFFERENT"
    tail -1 $OUT/run-$1-lookup${det:+-det}.err
  done
done
echo "== $(date +%T) pass costs ($((SECONDS - T0)) s)"
$B bench -m $M --device cuda --deterministic -p 1,2,3,5,8,9,17 -u 32 -n 0 -d 1024 -r 3 2>&1 | tee $OUT/costs-det.md | tail -8
left $((BUDGET * 33 / 100)) && $B bench -m $M --device cuda -p 1,2,3,5,8,9,17 -u 32 -n 0 -d 1024 -r 3 2>&1 | tee $OUT/costs.md | tail -8
echo "== $(date +%T) tandem A B B A ($((SECONDS - T0)) s)"
for f in ${TEXTS:-code story licence}; do
  left $((BUDGET * 58 / 100)) || break
  i=0
  for arm in off lookup lookup off; do
    i=$((i+1))
    $B bench -m $M --device cuda --deterministic -p 0 -n 128 -r 3 --prompt-file bench/spec/$f.txt --spec $arm \
      --output-format json > $OUT/spec-$f-$i-$arm.json 2>>$OUT/spec.err
  done
done
python3 - "$OUT" <<'PY' | tee $OUT/spec.md
import json, sys, glob, statistics
out = sys.argv[1]
print("| text | off tok/s | lookup tok/s | gain (median of pairs) | kept | tokens a step |")
print("|---|---:|---:|---:|---:|---:|")
for f in ("code", "story", "licence"):
    runs = {}
    for i, arm in enumerate(("off", "lookup", "lookup", "off"), 1):
        try:
            runs[i] = json.load(open(f"{out}/spec-{f}-{i}-{arm}.json"))[0]
        except Exception:
            pass
    if len(runs) < 4:
        continue
    off = [runs[1]["tok_s"], runs[4]["tok_s"]]; on = [runs[2]["tok_s"], runs[3]["tok_s"]]
    gain = statistics.median([on[0] / off[0], on[1] / off[1]])
    print(f"| {f} | {statistics.median(off):.1f} | {statistics.median(on):.1f} | {gain:.2f}x | {runs[2].get('acceptance', 0):.2f} | {runs[2].get('tokens_per_step', 0):.2f} |")
PY
[ -n "$build" ] || { echo "== $(date +%T) end ($((SECONDS - T0)) s)"; exit 0; }
echo "== $(date +%T) llama.cpp ($((SECONDS - T0)) s)"
while kill -0 $build 2>/dev/null && left $((BUDGET * 65 / 100)); do sleep 5; done
cat $W/build.status 2>/dev/null || echo "llama.cpp build not finished"
L=$W/lcb/bin
if [ -x $L/llama-lookup ]; then
  for f in licence code story; do
    for n in 0 8; do
      left $((BUDGET * 81 / 100)) || break 2
      timeout 45 $L/llama-lookup -m $M -ngl 99 -fa on -c 8192 -n 128 -f bench/spec/$f.txt --spec-draft-n-max $n --temp 0 > $OUT/ll-$f-$n.log 2>&1
      echo "llama-lookup $f n_max=$n: $(grep -E 'decoded' $OUT/ll-$f-$n.log | tail -1) $(grep -E 'accept' $OUT/ll-$f-$n.log | tail -1)"
    done
  done
fi
echo "== $(date +%T) end ($((SECONDS - T0)) s)"
