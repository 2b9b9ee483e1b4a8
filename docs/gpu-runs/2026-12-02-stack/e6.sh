#!/usr/bin/env bash
# Call e6: binary e6 = e3 + the mma.sync flash kernels' tile copies with each thread's chunk and
# place worked out once (`fa_load_tile<..., HOISTED>`; the one-m-tile kernels, every head size: on
# sm_90 the 64- and 256-wide heads, elsewhere all), and `--bench-flash` over the 128-, 256- and
# 64-wide model shapes. Kernel checks (e6); flash timings e6 e3 e6; gemma3-270m (256-wide heads) end
# to end, and its prefill e6 e3 e3 e6.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in e6 e3; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
( $W/bin/e6 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) & PS=$!
timeout 200 $W/bin/e6 gpu-check --bench-flash > $OUT/kernels-e6.md 2>$W/kernels.err
echo "kernel checks e6: exit $?, $(grep -c '| yes |' $OUT/kernels-e6.md) yes, $(grep -c '| NO |' $OUT/kernels-e6.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels-e6.md | cut -c1-300 | tee -a $S; tail -1 $W/kernels.err | tee -a $S
timeout 100 $W/bin/e3 gpu-check --no-kernel-checks --bench-flash > $OUT/flash-e3.md 2>>$W/kernels.err
timeout 100 $W/bin/e6 gpu-check --no-kernel-checks --bench-flash > $OUT/flash-e6b.md 2>>$W/kernels.err
echo "flash timings done ($(el))" | tee -a $S
wait $PS
timeout 100 $W/bin/e6 gpu-check -m $W/g.gguf --hash-prompt 600 --no-kernel-checks > $OUT/check.md 2>$W/check.err
echo "gpu-check gemma3-270m: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "greedy\|sha256" $OUT/check.md | cut -c1-200 | tee -a $S
run() { local b=$1; echo "== $b $(el)" >> $R; for ub in 512 4096; do timeout 100 $W/bin/$b bench -m $W/g.gguf --device cuda -r 5 --output-format json -p 4096 -n 0 --ubatch $ub 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_") + "_ub" + sys.argv[2], round(r["tok_s"],1))' $b $ub | tee -a $R; done; }
for b in e6 e3 e3 e6; do run $b; done
python3 - $OUT <<'PY' | tee -a $S
import sys, re, collections, statistics
out = sys.argv[1]
def rows(f):
    d = {}
    for line in open(f"{out}/{f}"):
        m = re.match(r"\| flash timing (\S+)( \(chosen\))?, (.*?) \| ([\d.]+) us, (\d+) TFLOP/s", line)
        if m: d[(m.group(1) + (" *" if m.group(2) else ""), m.group(3))] = float(m.group(4))
    return d
a, b, c = rows("kernels-e6.md"), rows("flash-e3.md"), rows("flash-e6b.md")
print("| variant | shape | e6 µs (two runs) | e3 µs | e3 / e6 |")
print("|---|---|---:|---:|---:|")
for k in a:
    if k in b and k in c:
        e6 = statistics.median([a[k], c[k]])
        print(f"| {k[0]} | {k[1]} | {a[k]:.1f} / {c[k]:.1f} | {b[k]:.1f} | {b[k] / e6:.2f}x |")
v = collections.defaultdict(list)
for line in open(f"{out}/results.txt"):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="): v[(f[0], f[1])].append(float(f[2]))
for t in sorted({k[1] for k in v}):
    n, m = v[("e6", t)], v[("e3", t)]
    print(f"gemma3-270m {t}: e6 {' / '.join('%.0f' % x for x in n)}, e3 {' / '.join('%.0f' % x for x in m)}: {statistics.median(n) / statistics.median(m):.3f}x")
PY
echo "all done $(el)"
