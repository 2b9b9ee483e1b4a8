#!/usr/bin/env bash
# Call k5: bulk-fed only for gate + up (TANDEM_CUDA_BULK_MIN_ROWS=10000: gate and up alone and together, not down, q + k + v, o or the head (BULK_MAX_ROWS=30000);
# k5 = k4 plus that knob), all of a warp's rows requested before its wait: the launch whose in-graph gain was
# largest (k2: 15.7 us against 18.0) and whose predecessor is a one-block add + norm. A B B A against
# the load-time choices, with D = 1, 2, 4 rows ahead and the timing's pick among them.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-k5; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
GU="TANDEM_CUDA_BULK_MIN_ROWS=10000 TANDEM_CUDA_BULK_MAX_ROWS=30000"
tg() { echo "$1 $(env $2 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg default ""; tg gu-any "$GU TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t"; tg gu-u2 "$GU TANDEM_CUDA_MMVQ=u2r1s1t"; tg gu-u4 "$GU TANDEM_CUDA_MMVQ=u4r1s1t";
  tg gu-u1 "$GU TANDEM_CUDA_MMVQ=u1r1s1t"; tg gu-u4 "$GU TANDEM_CUDA_MMVQ=u4r1s1t"; tg gu-u2 "$GU TANDEM_CUDA_MMVQ=u2r1s1t"; tg gu-any "$GU TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t"; tg default ""; echo "at $(el)"; } > $W/tg.txt 2>&1; cat $W/tg.txt >> $R; cat $W/tg.txt; tail -3 $W/bench.err
env $GU TANDEM_CUDA_MMVQ=u1r1s1t,u2r1s1t,u4r1s1t $B bench -m $W/q4.gguf --device cuda -p 0 -n 8 -r 1 -v 2>&1 | grep -i "decode kernel\|group" | sort | uniq -c > $OUT/choices-gu-any.txt; cat $OUT/choices-gu-any.txt
echo "total $(el)"
