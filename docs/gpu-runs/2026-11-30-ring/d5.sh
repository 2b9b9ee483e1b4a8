#!/usr/bin/env bash
# Call d5: t2 = q1 (main with QK-norm in the fused attention kernel) plus the in-graph timing of
# decode kernels (`exp/tune-in-step`, no change on the 8B Q4_K_M in call d3): does it help the
# Gemma shapes? tg128 q1 t2 t2 q1 on the Gemma-3-27B-shaped Q4_K_M (three repetitions) and on
# gemma3-270m (six); the kernels each picks on the 27B.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
Q1=.gpu/tandem-q1; T2=.gpu/tandem-t2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $Q1 synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf 2>&1 | tail -1 ) & P27=$!
$Q1 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1; wait $P27; echo "synth done $(el)"
tg() { echo "$1 $2 $($3 bench -m $W/$2.gguf --device cuda -p 0 -n 128 -r $4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg q1 g27 $Q1 3; tg t2 g27 $T2 3; tg t2 g27 $T2 3; tg q1 g27 $Q1 3; echo "at $(el)"
  tg q1 g $Q1 6; tg t2 g $T2 6; tg t2 g $T2 6; tg q1 g $Q1 6; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt >> $R
for b in q1 t2; do echo "== decode kernels $b g27" >> $R; .gpu/tandem-$b bench -m $W/g27.gguf --device cuda -p 0 -n 8 -r 1 -v 2>&1 | grep "decode kernel" | head -12 >> $R; done
grep -A12 "decode kernels" $R | cut -c1-90; cat $W/tg.txt; echo "total $(el)"
