#!/usr/bin/env bash
# Call d12 (the occ session): why d11 saw gemma3-270m batches 2-7% slower on d10 (main 9d6749a) than
# on base (c47320a). The routes d10 picks for gemma3-270m (-v), then 4, 16 and 64 sequences in the
# order d10, d10 with TANDEM_CUDA_DQMMA=0 (the dequantizing kernel off), base, base, off, d10.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt; R=$OUT/results.txt
for b in d10 base; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
$W/bin/d10 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 60 $W/bin/d10 bench -m $W/g.gguf --device cuda -v -p 0 -n 1 -r 1 > $OUT/routes.txt 2>&1
grep -i "batches" $OUT/routes.txt | cut -c1-250 | sort | uniq -c | sort -rn | tee -a $S
run() { local l=$1 b=$2 off=$3; echo "== $l $(el)" >> $R; TANDEM_CUDA_DQMMA=$off timeout 60 $W/bin/$b bench -m $W/g.gguf --device cuda -r 2 --output-format json -p 0 -n 32 -d 128 --parallel 4,16,64 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_"), round(r["tok_s"],1))' $l | tee -a $R; }
run d10 d10 1; run off d10 0; run base base 1; run base base 1; run off d10 0; run d10 d10 1
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="): v[(f[0], f[1])].append(float(f[2]))
print("| gemma3-270m test | d10 | d10, dqmma off | base | d10 / base | off / base |"); print("|---|---:|---:|---:|---:|---:|")
for t in sorted({k[1] for k in v}, key=lambda s: (len(s), s)):
    a, o, b = (statistics.median(v[(n, t)]) for n in ("d10", "off", "base"))
    print(f"| {t} | {a:.0f} | {o:.0f} | {b:.0f} | {a/b:.3f}x | {o/b:.3f}x |")
PY
echo "all done $(el)"
