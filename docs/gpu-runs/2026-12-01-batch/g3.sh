#!/usr/bin/env bash
# Call g3 (g2 again, its kernels now registered): binary g3 = g1 + a batched decode step's attention in one launch for all its sequences
# (`attend_rope_rows_*`) and every sequence's logits in one pass over the output matrix. Kernel checks
# (the new batched-vs-alone rows); `serve --device cuda` checks on gemma3-270m; tg32 @ d128 with 1-64
# sequences decoded together, g3 against g1 and llama-batched-bench; the matvec/GEMM crossover for
# short batches (TANDEM_CUDA_MATVEC_MAX_ROWS=4: batches of 5+ rows through the GEMM).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin $W/lcb; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in g1 g3; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb; export LD_LIBRARY_PATH=$W/lcb:$LD_LIBRARY_PATH
B=$W/bin/g3
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 200 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err; rc=$?
echo "kernel checks: exit $rc, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S
grep "batched fused decode" $OUT/kernels.md | cut -c1-330 | tee -a $S
TANDEM=$B WORK=$W/sc timeout 180 bash scripts/gpu_serve_check.sh $W/g.gguf > $W/serve.txt 2>&1
echo "serve check gemma3-270m: exit $? ($(el))" | tee -a $S; grep -E "FAIL|\| " $W/serve.txt | tail -14 | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf
run() { local l=$1 bin=$2; shift 2; echo "== $l $(el)" >> $R; env "$@" timeout 200 $W/bin/$bin bench -m $M --device cuda -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,4,6,8,16,32,64"
run new g3 X=0; run old g1 X=0
timeout 150 $W/lcb/llama-batched-bench -m $M -ngl 99 -fa on -c 20000 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,2,4,8,16,32,64 > $W/bb.txt 2>$W/bb.err
grep "^|" $W/bb.txt | tee -a $R | python3 -c '
import sys
for line in sys.stdin:
    c = [x.strip() for x in line.split("|")[1:-1]]
    if c and c[0].isdigit(): print("L", "tg32_@_d128" + ("_x" + c[2] if c[2] != "1" else ""), c[7])' | tee -a $R
run new g3 X=0
run gemm g3 TANDEM_CUDA_MATVEC_MAX_ROWS=4
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,4,6,8,16,32,64 --deterministic"; run det g3 X=0
ARGS="-p 2,3,4,5,6,8 -n 0"; run new g3 X=0; run gemm g3 TANDEM_CUDA_MATVEC_MAX_ROWS=4
tail -3 $W/bench.err
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("|"):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["new", "old", "gemm", "det", "L"]
print("| test | " + " | ".join(cols) + " | new / L |")
print("|---|" + "---:|" * (len(cols) + 1))
key = lambda t: (t.startswith("tg"), int(t.split("_x")[1]) if "_x" in t else (int(''.join(ch for ch in t if ch.isdigit())) if t.startswith("pp") else 1))
for t in sorted({k[1] for k in v}, key=key):
    med = lambda c: statistics.median(v[(c, t)]) if v.get((c, t)) else None
    f = lambda x: "-" if x is None else "%.0f" % x
    n, l = med("new"), med("L")
    print(f"| {t} | " + " | ".join(f(med(c)) for c in cols) + f" | {'-' if not (n and l) else '%.2fx' % (n / l)} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
