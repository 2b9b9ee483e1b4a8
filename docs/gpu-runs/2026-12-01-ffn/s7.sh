#!/usr/bin/env bash
# Call s7: chunks asked into L2 only while the ring is full and the compute warps wait (binary s7:
# TANDEM_CUDA_FFN_AHEAD now bounds those chunks; the feeding lane polls its slot with test_wait), after
# s6 found the ring full through most waits. Kernel checks (half the cases with 8 ahead) while the 8B is
# written; tg128 at 8 compute warps with 0, 8 and 16 chunks ahead, 16 warps with 16 ahead, and
# chained, in order then reverse; then each phase and the ring at each mark at 8 warps, 0 and 16 ahead.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/s/tandem-s7; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 120 $B gpu-check > $OUT/kernels.md 2>$OUT/kernels.err; rc=$?; echo "kernel checks exit $rc $(el)"
grep -c "streamed.*| yes |" $OUT/kernels.md; grep "| NO |" $OUT/kernels.md | cut -c1-220; tail -1 $OUT/kernels.err
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
tg() { local l=$1; shift; echo "$l $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 5 2>>$W/bench.err | grep tg128 | cut -d'|' -f4,5)"; }
run() { case $1 in
    w8a0) tg $1 TANDEM_CUDA_FFN=stream8;;
    w8a8) tg $1 TANDEM_CUDA_FFN=stream8 TANDEM_CUDA_FFN_AHEAD=8;;
    w8a16) tg $1 TANDEM_CUDA_FFN=stream8 TANDEM_CUDA_FFN_AHEAD=16;;
    w16a16) tg $1 TANDEM_CUDA_FFN=stream16 TANDEM_CUDA_FFN_AHEAD=16;;
    chained) tg $1 TANDEM_CUDA_FFN=chained;;
  esac; }
{ for c in w8a0 w8a8 w8a16 w16a16 chained chained w16a16 w8a16 w8a8 w8a0; do run $c; done; } | tee -a $R
echo "tg done $(el)"; tail -2 $W/bench.err
ring() { python3 - "$1" <<'PY'
import sys, statistics, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
rows = sorted(rows[-60000:], key=lambda r: (int(r[1]), int(r[0])))
marks = collections.defaultdict(list)
for i, r in enumerate(rows[:-1]):
    if r[2].startswith("ffn"):
        # the phase from this mark to the next release, and the ring's counts at the mark
        marks[r[2] if r[2].startswith("ffn:") else "ffn_stream"].append(
            ((int(rows[i + 1][1]) - int(r[1])) / 1e3, int(r[4]), int(r[5])))
print("| mark | records | phase us (median) | landed (median) | in flight (median) |")
print("|---|---:|---:|---:|---:|")
for m in ["ffn_stream", "ffn:gate+up", "ffn:publish+wait", "ffn:gating", "ffn:down", "ffn:tail"]:
    v = marks.get(m, [])
    if not v: continue
    med = lambda k: statistics.median(x[k] for x in v)
    ring = (med(1), med(2)) if m != "ffn_stream" else ("-", "-")
    print(f"| {m} | {len(v)} | {med(0):.2f} | {ring[0]} | {ring[1]} |")
PY
}
trace() { local l=$1; shift
  env "$@" TANDEM_CUDA_TRACE=$W/trace-$l.tsv timeout 60 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  echo "== timeline $l" >> $R; ring $W/trace-$l.tsv >> $R; }
trace w8a0 TANDEM_CUDA_FFN=stream8; trace w8a16 TANDEM_CUDA_FFN=stream8 TANDEM_CUDA_FFN_AHEAD=16
echo "all done $(el)"; tail -n 3 $W/trace.err
