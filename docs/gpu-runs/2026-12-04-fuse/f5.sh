#!/usr/bin/env bash
# Call f5 (the fuse session): binary f4 again, tg128 on the 8B Q4_K_M with the fused route on and off,
# each with programmatic edges (main's decode graphs) and without them (TANDEM_CUDA_PDL=0: every
# kernel starts once the one before has finished), to tell whether the fused route's loss comes from
# down starting early beside gate + up (the overlap) or from its kernels.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt; R=$OUT/results.txt
gunzip -c .gpu/f/tandem-f4.gz > $W/bin/f4; chmod +x $W/bin/f4; B=$W/bin/f4
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf > $W/synth.log 2>&1; echo "synth $(el)" | tee -a $S
run() { echo "== $1 $(el)" >> $R; timeout 75 env TANDEM_CUDA_FUSED_FFN=$2 TANDEM_CUDA_PDL=$3 $B bench -m $W/q4.gguf --device cuda -r 5 --output-format json -p 0 -n 128 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"], round(r["tok_s"],1))' $1 | tee -a $R; }
for l in on-pdl off-pdl on-nopdl off-nopdl off-nopdl on-nopdl off-pdl on-pdl; do
  case $l in on-pdl) run $l 1 1;; off-pdl) run $l 0 1;; on-nopdl) run $l 1 0;; off-nopdl) run $l 0 0;; esac; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="): v[f[0]].append(float(f[2]))
for edges in ["pdl", "nopdl"]:
    on, off = v.get("on-" + edges, []), v.get("off-" + edges, [])
    if on and off:
        a, b = statistics.median(on), statistics.median(off)
        print(f"| {edges} | fused {a:.1f} | chained {b:.1f} | {a/b:.3f}x | {' / '.join('%.1f' % x for x in on)} | {' / '.join('%.1f' % x for x in off)} |")
PY
echo "all done $(el)"
