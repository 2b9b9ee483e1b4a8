#!/usr/bin/env bash
# Call k2: why the bulk-fed matvecs lost (k1: never chosen; forced, tg128 -4%). k2 = k1 plus one-row-
# ahead variants (u1r1s1t). `gpu-check --bench-matvec`: every integer variant on the 8B decode shapes,
# launched back to back over four copies of each matrix (weights from memory). Then timelines of
# tg128 (TANDEM_CUDA_TRACE) for the load-time choices and with the bulk-fed variants forced.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-k2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf > $W/synth.log 2>&1 &
SP=$!
timeout 250 $B gpu-check --bench-matvec > $OUT/bench-matvec.md 2>$W/bench-matvec.err; echo "bench exit $? $(el)"
grep "Int8" $OUT/bench-matvec.md | grep -v quantize | grep "Q4_K 14336x4096\|Q4_K 4096x14336\|Q4_K 4096x4096\|Q6_K 4096x14336\|Q6_K 1024x4096" | cut -c1-110
wait $SP; tail -1 $W/synth.log; echo "synth done $(el)"
for cfg in default bulk; do
  E=""; [ $cfg = bulk ] && E=TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t
  env $E TANDEM_CUDA_TRACE=$W/trace-$cfg.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  env $E $B bench -m $W/q4.gguf --device cuda -p 0 -n 8 -r 1 -v 2>&1 | grep -i "decode kernel" | sort | uniq -c > $OUT/choices-$cfg.txt
  python3 scripts/trace_summary.py $W/trace-$cfg.tsv --sequence 12 > $OUT/timeline-$cfg.md 2>&1; head -14 $OUT/timeline-$cfg.md; done
echo "total $(el)"
