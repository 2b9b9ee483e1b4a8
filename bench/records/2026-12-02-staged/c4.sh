#!/usr/bin/env bash
# Call c4: c2's binaries. The deterministic mode's batched decode (every matmul on the matvec route,
# so batches now take the staged batch kernels): tg32 @ d128 at 1-8 sequences, new prev prev new.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in new prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/new
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; G=$W/g.gguf
run() { local l=$1 bin=$2 m=$3; echo "== $l $(el)" >> $R; timeout 150 $W/bin/$bin bench -m $m --device cuda --deterministic -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], sys.argv[2] + "_" + r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l $(basename $m .gguf) | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,3,4,8,16"
for m in $M $G; do run new new $m; run prev prev $m; run prev prev $m; run new new $m; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3:
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
print("| test (deterministic) | new | prev | new / prev | new runs | prev runs |")
print("|---|---:|---:|---:|---|---|")
def key(t): return (t.split("_tg")[0], int(t.split("_x")[1]) if "_x" in t else 1)
for t in sorted({k[1] for k in v}, key=key):
    n, p = statistics.median(v[("new", t)]), statistics.median(v[("prev", t)])
    print(f"| {t} | {n:.0f} | {p:.0f} | {n / p:.2f}x | " + " / ".join("%.0f" % x for x in v[("new", t)]) + " | " + " / ".join("%.0f" % x for x in v[("prev", t)]) + " |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
