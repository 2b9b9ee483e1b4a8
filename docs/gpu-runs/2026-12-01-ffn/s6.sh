#!/usr/bin/env bash
# Call s6: what the ring holds at each phase mark (binary s6: block 0's marks also count the slots
# whose next chunk has landed and those still in flight; grid_y and grid_z of the mark's record).
# Timelines of the 8B Q4_K_M's tg128 at 8 and 16 compute warps (whole ring before the wait).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/s/tandem-s6; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth $(el)"
ring() { python3 - "$1" <<'PY'
import sys, statistics, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
marks = collections.defaultdict(list)
for r in rows[-60000:]:
    if r[2].startswith("ffn:"):
        marks[r[2]].append((int(r[4]), int(r[5])))
print("| mark | records | landed (median, p10-p90) | in flight (median, p10-p90) |")
print("|---|---:|---|---|")
for m in ["ffn:gate+up", "ffn:publish+wait", "ffn:gating", "ffn:down", "ffn:tail"]:
    v = marks.get(m, [])
    if not v: continue
    q = lambda xs: (statistics.median(xs), sorted(xs)[len(xs)//10], sorted(xs)[9*len(xs)//10])
    l, f = q([a for a, _ in v]), q([b for _, b in v])
    print(f"| {m} | {len(v)} | {l[0]} ({l[1]}-{l[2]}) | {f[0]} ({f[1]}-{f[2]}) |")
PY
}
for w in 8 16; do
  TANDEM_CUDA_FFN=stream$w TANDEM_CUDA_TRACE=$W/trace-$w.tsv timeout 60 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  { echo "== ring, $w warps (16 slots of 12 KB)"; ring $W/trace-$w.tsv; echo; python3 scripts/trace_summary.py $W/trace-$w.tsv --gap-us 1000 --window-ms 150 2>&1 | tail -18; } >> $R
done
echo "all done $(el)"; tail -n 3 $W/trace.err; cat $R | grep -A8 "== ring"
