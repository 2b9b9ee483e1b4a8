#!/usr/bin/env bash
# Call k8: bulk-fed for the down projections only (TANDEM_CUDA_BULK_MIN=50M with BULK_MAX_ROWS=5000:
# the 4096 x 14336 launches; gate + up, q + k + v, o and the head keep the load-time choices). k3 with
# gate + up and down bulk-fed (529) beat k5 with gate + up alone (522), so down may gain alone; in
# k2's timeline it took 11.3 us against 15.1 (Q6_K) and 10.9 (Q4_K). k5's binary (k4 plus the row
# knobs). A B B A on the 8B Q4_K_M, D = 2, 4 and the timing's pick.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-k5; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
DN="TANDEM_CUDA_BULK_MIN=50000000 TANDEM_CUDA_BULK_MAX_ROWS=5000"
tg() { echo "$1 $(env $2 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg default ""; tg down-any "$DN TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t"; tg down-u2 "$DN TANDEM_CUDA_MMVQ=u2r1s1t"; tg down-u4 "$DN TANDEM_CUDA_MMVQ=u4r1s1t";
  tg down-u4 "$DN TANDEM_CUDA_MMVQ=u4r1s1t"; tg down-u2 "$DN TANDEM_CUDA_MMVQ=u2r1s1t"; tg down-any "$DN TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t"; tg default ""; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; tail -3 $W/bench.err
env $DN TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t $B bench -m $W/q4.gguf --device cuda -p 0 -n 8 -r 1 -v 2>&1 | grep -i "decode kernel\|group" | sort | uniq -c > $OUT/choices-down-any.txt; cat $OUT/choices-down-any.txt
echo "total $(el)"
