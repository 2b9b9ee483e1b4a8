#!/usr/bin/env bash
# Call c1: binary new = staged batch kernels (`mmvqpb*`), batch routes measured per row count at load,
# persistent qmma with loads before the wait; prev = 5eb7ce1 (main). gpu-check kernel checks and end
# to end with --bench-qmma; tg32 @ d128 at 1-16 sequences on the 8B Q4_K_M and gemma3-270m: new,
# nost (new with TANDEM_CUDA_STAGED_BATCH=0), prev, prev, nost, new; --verbose's batch routes.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt; X=$OUT/extra.txt
for b in new prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/new
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; G=$W/g.gguf
timeout 330 $B gpu-check -m $G -m $M --hash-prompt 600 --bench-qmma > $OUT/check.md 2>$W/check.err
echo "gpu-check: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-400 | tee -a $S; grep -i "matvec Int8\|qmma Q4\|sha256\|greedy\|together" $OUT/check.md | cut -c1-260 | tee -a $S
grep "batch speed" $OUT/check.md | cut -c1-300 | tee -a $S
tail -3 $W/check.err | tee -a $S
for m in $M $G; do echo "== $(basename $m) decode choices" >> $X; timeout 100 $B bench -m $m --device cuda -v -r 1 -p 0 -n 1 2>&1 | grep -i "decode kernel\|batch\|load" >> $X; done
run() { local l=$1 bin=$2 m=$3; shift 3; echo "== $l $(el)" >> $R; env "$@" timeout 150 $W/bin/$bin bench -m $m --device cuda -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], sys.argv[2] + "_" + r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l $(basename $m .gguf) | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,3,4,6,8,16"
for m in $M $G; do run new new $m; run nost new $m TANDEM_CUDA_STAGED_BATCH=0; run prev prev $m; run prev prev $m; run nost new $m TANDEM_CUDA_STAGED_BATCH=0; run new new $m; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("|"):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["new", "nost", "prev"]
print("| test | " + " | ".join(cols) + " | new / prev | new / nost | new runs | prev runs |")
print("|---|" + "---:|" * (len(cols) + 2) + "---|---|")
def key(t): return (t.split("_tg")[0], int(t.split("_x")[1]) if "_x" in t else 1)
for t in sorted({k[1] for k in v}, key=key):
    med = {c: statistics.median(v[(c, t)]) if v.get((c, t)) else None for c in cols}
    f = lambda x: "-" if x is None else "%.0f" % x
    r = lambda a, b: "-" if not (med[a] and med[b]) else "%.2fx" % (med[a] / med[b])
    j = lambda c: " / ".join(f(x) for x in v.get((c, t), []))
    print(f"| {t} | " + " | ".join(f(med[c]) for c in cols) + f" | {r('new', 'prev')} | {r('new', 'nost')} | {j('new')} | {j('prev')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
