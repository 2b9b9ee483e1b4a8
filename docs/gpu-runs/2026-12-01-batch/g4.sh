#!/usr/bin/env bash
# Call g4: binary g4 = g3 + a batched step's logits in one page-locked buffer, each span lent its rows
# (no vector copies). `serve --device cuda` checks on gemma3-270m; where a 64-sequence step's time goes
# (TANDEM_CUDA_PASS_TIMES, TANDEM_CUDA_PROFILE); tg32 @ d128 with 1-64 sequences, g4 / g3 /
# llama-batched-bench / g4.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin $W/lcb; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in g3 g4; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb; export LD_LIBRARY_PATH=$W/lcb:$LD_LIBRARY_PATH
B=$W/bin/g4
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
TANDEM=$B WORK=$W/sc timeout 180 bash scripts/gpu_serve_check.sh $W/g.gguf > $W/serve.txt 2>&1
echo "serve check gemma3-270m: exit $? ($(el))" | tee -a $S; grep -E "FAIL|\| " $W/serve.txt | tail -14 | cut -c1-160 | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf
for n in 16 64; do
  TANDEM_CUDA_PASS_TIMES=1 timeout 100 $B bench -m $M --device cuda -p 0 -n 8 -d 128 --parallel $n -r 1 2>&1 >/dev/null | grep "^pass: $n rows" | tail -4 | sed "s/^/x$n /" | tee -a $S
done
TANDEM_CUDA_PROFILE=1 timeout 100 $B bench -m $M --device cuda -p 0 -n 8 -d 128 --parallel 64 -r 1 2>$W/prof.txt >/dev/null
grep -v "^\s*$" $W/prof.txt | head -40 > $OUT/profile-x64.txt; head -25 $OUT/profile-x64.txt | cut -c1-150 | tee -a $S
run() { local l=$1 bin=$2; shift 2; echo "== $l $(el)" >> $R; env "$@" timeout 200 $W/bin/$bin bench -m $M --device cuda -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,4,8,16,32,64"
run new g4 X=0; run old g3 X=0
timeout 150 $W/lcb/llama-batched-bench -m $M -ngl 99 -fa on -c 20000 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,2,4,8,16,32,64 > $W/bb.txt 2>$W/bb.err
grep "^|" $W/bb.txt | tee -a $R | python3 -c '
import sys
for line in sys.stdin:
    c = [x.strip() for x in line.split("|")[1:-1]]
    if c and c[0].isdigit(): print("L", "tg32_@_d128" + ("_x" + c[2] if c[2] != "1" else ""), c[7])' | tee -a $R
run new g4 X=0
tail -3 $W/bench.err
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("|"):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["new", "old", "L"]
print("| test | " + " | ".join(cols) + " | new / old | new / L | new runs |")
print("|---|" + "---:|" * (len(cols) + 2) + "---|")
key = lambda t: int(t.split("_x")[1]) if "_x" in t else 1
for t in sorted({k[1] for k in v}, key=key):
    med = lambda c: statistics.median(v[(c, t)]) if v.get((c, t)) else None
    f = lambda x: "-" if x is None else "%.0f" % x
    n, o, l = med("new"), med("old"), med("L")
    r = lambda a, b: "-" if not (a and b) else "%.2fx" % (a / b)
    print(f"| {t} | " + " | ".join(f(med(c)) for c in cols) + f" | {r(n, o)} | {r(n, l)} | {' / '.join(f(x) for x in v[('new', t)])} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
