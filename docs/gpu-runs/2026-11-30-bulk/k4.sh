#!/usr/bin/env bash
# Call k4: k3 said the bulk-fed kernels need every resident warp (fewer blocks a multiprocessor:
# gate + up 33.9 us at three, -14% to -33% tg128). Second guess at the small kernels' slowdown before
# a bulk-fed launch: its warps' D requests each, issued before the wait (12-24 MB at once), crowd
# the memory system while the kernel before runs. TANDEM_CUDA_BULK_PREWAIT = rows a warp requests
# before its wait (the rest right after it). tg128 on the 8B Q4_K_M, bulk-fed everywhere ("all") or
# for the big launches only ("big"), then timelines.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-k4; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
ALL="TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t"; BIG="TANDEM_CUDA_BULK_MIN=50000000 $ALL"
tg() { echo "$1 $(env $2 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 3 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg default ""; tg all-pre1 "$ALL TANDEM_CUDA_BULK_PREWAIT=1"; tg all-pre0 "$ALL TANDEM_CUDA_BULK_PREWAIT=0";
  tg big-pre1 "$BIG TANDEM_CUDA_BULK_PREWAIT=1"; tg big-pre0 "$BIG TANDEM_CUDA_BULK_PREWAIT=0"; tg all "$ALL";
  tg big-pre0 "$BIG TANDEM_CUDA_BULK_PREWAIT=0"; tg big-pre1 "$BIG TANDEM_CUDA_BULK_PREWAIT=1";
  tg all-pre0 "$ALL TANDEM_CUDA_BULK_PREWAIT=0"; tg all-pre1 "$ALL TANDEM_CUDA_BULK_PREWAIT=1"; tg default ""; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; tail -3 $W/bench.err
for cfg in all-pre1 big-pre1; do
  E="$ALL"; [ $cfg = big-pre1 ] && E="$BIG"
  env $E TANDEM_CUDA_BULK_PREWAIT=1 $B bench -m $W/q4.gguf --device cuda -p 0 -n 8 -r 1 -v 2>&1 | grep -i "decode kernel\|group" | sort | uniq -c > $OUT/choices-$cfg.txt
  env $E TANDEM_CUDA_BULK_PREWAIT=1 TANDEM_CUDA_TRACE=$W/trace-$cfg.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  python3 scripts/trace_summary.py $W/trace-$cfg.tsv --sequence 12 > $OUT/timeline-$cfg.md 2>&1; head -16 $OUT/timeline-$cfg.md; done
echo "total $(el)"
