#!/usr/bin/env bash
# Call c3: c2's binaries. The serving checks (lone vs batched tokens, deterministic bits) on both
# models with the new batch routes, and the load time the per-row-count batch timing adds: wall
# seconds of `bench -p 0 -n 1` (load, tuning, one token), kernel cache warm, new prev prev new.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
for b in new prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/new
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $PS; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; G=$W/g.gguf
for m in $G $M; do
  TANDEM=$B WORK=$W/sc-$(basename $m .gguf) timeout 200 bash scripts/gpu_serve_check.sh $m > $OUT/serve-$(basename $m .gguf).txt 2>&1
  echo "serve check $(basename $m): exit $?, $(grep -c FAIL $OUT/serve-$(basename $m .gguf).txt) FAIL ($(el))" | tee -a $S
  grep -E "FAIL" $OUT/serve-$(basename $m .gguf).txt | cut -c1-200 | tee -a $S
done
for m in $M $G; do
  for b in new prev; do $W/bin/$b bench -m $m --device cuda -r 1 -p 0 -n 1 > /dev/null 2>&1; done
  for b in new prev prev new; do
    s=$(date +%s.%N); $W/bin/$b bench -m $m --device cuda -r 1 -p 0 -n 1 > /dev/null 2>&1
    echo "load $(basename $m) $b $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s" | tee -a $S
  done
done
echo "all done $(el)"; echo "===== summary"; cat $S
