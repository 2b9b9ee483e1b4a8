#!/usr/bin/env bash
# Call k3: bulk-fed variants only where the weights are many (TANDEM_CUDA_BULK_MIN: rows x cols of the
# launch; 50M keeps gate + up and down, not q + k + v or o), and fewer bulk-fed blocks a
# multiprocessor (TANDEM_CUDA_BULK_PER_SM), so that the kernel before them can still run beside their
# early blocks. k2's timeline: bulk-fed gate + up 15.7 us against 18.0, down 11.3 against 13.0 on
# average, but each small kernel before a bulk-fed launch 0.6-0.9 us slower. tg128 on the 8B Q4_K_M.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-k3; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
BIG="TANDEM_CUDA_BULK_MIN=50000000 TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t"
tg() { echo "$1 $(env $2 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 3 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg default ""; tg big "$BIG"; tg big-sm4 "$BIG TANDEM_CUDA_BULK_PER_SM=4"; tg big-sm3 "$BIG TANDEM_CUDA_BULK_PER_SM=3";
  tg big-sm2 "$BIG TANDEM_CUDA_BULK_PER_SM=2"; tg big-u4-sm2 "TANDEM_CUDA_BULK_MIN=50000000 TANDEM_CUDA_MMVQ=u4r1s1t TANDEM_CUDA_BULK_PER_SM=2";
  tg all-sm3 "TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t TANDEM_CUDA_BULK_PER_SM=3";
  tg big-sm3 "$BIG TANDEM_CUDA_BULK_PER_SM=3"; tg big-sm4 "$BIG TANDEM_CUDA_BULK_PER_SM=4"; tg default ""; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; tail -3 $W/bench.err
for cfg in sm3 sm2; do
  N=${cfg#sm}
  env $BIG TANDEM_CUDA_BULK_PER_SM=$N $B bench -m $W/q4.gguf --device cuda -p 0 -n 8 -r 1 -v 2>&1 | grep -i "decode kernel\|group" | sort | uniq -c > $OUT/choices-$cfg.txt
  env $BIG TANDEM_CUDA_BULK_PER_SM=$N TANDEM_CUDA_TRACE=$W/trace-$cfg.tsv timeout 90 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
  python3 scripts/trace_summary.py $W/trace-$cfg.tsv --sequence 12 > $OUT/timeline-$cfg.md 2>&1; head -14 $OUT/timeline-$cfg.md; done
echo "total $(el)"
