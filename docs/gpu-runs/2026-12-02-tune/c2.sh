#!/usr/bin/env bash
# Call c2: binary new2 = c1's new without the chain timing (c1's chain0) + staged batch kernels that
# keep each warp's next step of weight loads in flight across its row groups (`mmvqpa<NB>`, taken
# with TANDEM_CUDA_BATCH_AHEAD=1). Kernel checks with the ahead kernels and `--bench-qmma` both ways;
# --verbose routes both ways; tg32 @ d128 at 1-8 sequences on the 8B Q4_K_M and gemma3-270m: ahead,
# plain, plain, ahead; the serve checks on both models (plain).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt; X=$OUT/extra.txt
gunzip -c .gpu/f/tandem-new2.gz > $W/bin/new2; chmod +x $W/bin/new2; B=$W/bin/new2
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
for a in 1 0; do TANDEM_CUDA_BATCH_AHEAD=$a timeout 200 $B gpu-check --bench-qmma > $OUT/check-ahead$a.md 2>$W/check.err
  echo "kernel checks, ahead=$a: exit $?, $(grep -c '| yes |' $OUT/check-ahead$a.md) yes, $(grep -c '| NO |' $OUT/check-ahead$a.md) NO ($(el))" | tee -a $S
  grep "| NO |" $OUT/check-ahead$a.md | cut -c1-300 | tee -a $S; done
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; G=$W/g.gguf
for m in $M $G; do for a in 1 0; do echo "== $(basename $m) decode choices: ahead=$a" >> $X
  TANDEM_CUDA_BATCH_AHEAD=$a timeout 100 $B bench -m $m --device cuda -v -r 1 -p 0 -n 1 2>&1 | grep -i "decode kernel" >> $X; done; done
run() { local l=$1 m=$2; shift 2; echo "== $l $(el)" >> $R; env "$@" timeout 150 $B bench -m $m --device cuda -r 3 --output-format json $ARGS 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], sys.argv[2] + "_" + r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l $(basename $m .gguf) | tee -a $R; }
ARGS="-p 0 -n 32 -d 128 --parallel 1,2,3,4,6,8"
for m in $M $G; do run ahead $m TANDEM_CUDA_BATCH_AHEAD=1; run plain $m; run plain $m; run ahead $m TANDEM_CUDA_BATCH_AHEAD=1; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3:
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
cols = ["ahead", "plain"]
print("| test | ahead | plain | ahead / plain | ahead runs | plain runs |")
print("|---|---:|---:|---:|---|---|")
def key(t): return (t.split("_tg")[0], int(t.split("_x")[1]) if "_x" in t else 1)
for t in sorted({k[1] for k in v}, key=key):
    med = {c: statistics.median(v[(c, t)]) if v.get((c, t)) else None for c in cols}
    f = lambda x: "-" if x is None else "%.0f" % x
    j = lambda c: " / ".join(f(x) for x in v.get((c, t), []))
    print(f"| {t} | {f(med['ahead'])} | {f(med['plain'])} | {med['ahead'] / med['plain']:.2f}x | {j('ahead')} | {j('plain')} |")
PY
for m in $G $M; do [ $(( $(date +%s)-T0 )) -gt 420 ] && break
  TANDEM=$B WORK=$W/sc-$(basename $m .gguf) timeout 170 bash scripts/gpu_serve_check.sh $m > $OUT/serve-$(basename $m .gguf).txt 2>&1
  echo "serve check $(basename $m): exit $?, $(grep -c FAIL $OUT/serve-$(basename $m .gguf).txt) FAIL ($(el))" | tee -a $S
  grep -E "FAIL" $OUT/serve-$(basename $m .gguf).txt | cut -c1-200 | tee -a $S; done
for a in 1 0; do echo "== batch speed, ahead=$a" >> $S; grep "batch speed" $OUT/check-ahead$a.md | cut -c1-260 >> $S; done
echo "all done $(el)"; echo "===== summary"; cat $S; grep -v "^|" $X | head -40
