#!/usr/bin/env bash
# Call d10 (the occ session): binary d10 = the form to land: dqmma's one n-tile (batches of up to 8
# rows) with d8's weights straight into registers, two and four n-tiles with d9's warp stages; base =
# main c47320a. Every kernel check (both models written meanwhile), the routes chosen, batched
# decode d10 base base d10 at 4-64 sequences, tg128 of one sequence the same way, and the model
# checks (greedy against the CPU, batches of 4-24 against each sequence alone) on both models.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt; R=$OUT/results.txt
for b in d10 base; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/d10
( $B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/gemma3-270m.gguf > $W/synth.log 2>&1
  $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf >> $W/synth.log 2>&1 ) &
SYN=$!
timeout 200 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S; grep -i "dqmma" $OUT/kernels.md | cut -c1-400 | tee -a $S
wait $SYN; tail -2 $W/synth.log; echo "synth done $(el)" | tee -a $S
if ! grep -q "^| dqmma .*| yes |$" $OUT/kernels.md; then echo "dqmma check did not pass: stopping"; cat $S; exit 1; fi
timeout 60 $B bench -m $W/q4.gguf --device cuda -v -p 0 -n 1 -r 1 > $OUT/routes.txt 2>&1
grep -i "batches" $OUT/routes.txt | cut -c1-250 | sort | uniq -c | sort -rn | head -12 | tee -a $S
run() { local l=$1; echo "== $l $(el)" >> $R; timeout 110 $W/bin/$l bench -m $W/q4.gguf --device cuda -r 2 --output-format json -p 0 -n 32 -d 128 --parallel 4,8,12,16,24,32,48,64 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), r.get("parallel", r.get("n_seq", "")), round(r["tok_s"],1))' $l | tee -a $R
  timeout 60 $W/bin/$l bench -m $W/q4.gguf --device cuda -r 3 --output-format json -p 0 -n 128 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), 1, round(r["tok_s"],1))' $l | tee -a $R; }
for l in d10 base base d10; do run $l; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 3 and not line.startswith("=="):
        try: v[(f[0], " ".join(f[1:-1]))].append(float(f[-1]))
        except ValueError: pass
print("| 8B Q4_K_M test | d10 | base | ratio | d10 runs | base runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}, key=lambda s: (len(s), s)):
    n, m = v.get(("d10", t), []), v.get(("base", t), [])
    if not n or not m: continue
    a, b = statistics.median(n), statistics.median(m)
    print(f"| {t} | {a:.0f} | {b:.0f} | {a/b:.3f}x | {' / '.join('%.0f' % x for x in n)} | {' / '.join('%.0f' % x for x in m)} |")
PY
timeout 260 $B gpu-check --no-kernel-checks -m $W/gemma3-270m.gguf -m $W/q4.gguf --prompt 300 --gen 16 --hash-prompt 300 > $OUT/check.md 2>$W/check.err
echo "model checks: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep -E "\| NO \||decoded together vs" $OUT/check.md | cut -c1-300 | tee -a $S; tail -2 $W/check.err | tee -a $S
echo "all done $(el)"; echo "===== summary"; cat $S
