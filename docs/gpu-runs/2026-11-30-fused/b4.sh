#!/usr/bin/env bash
# Call b4: the Gemma-3-27B-shaped Q4_K_M: main (b2) against g (c09da2e, the attention session's tree)
# and llama-bench -ngl 99 -fa 1, tg128 in the order g b2 L b2 g (three repetitions each) after the
# synthesis; then, if the call has time left, Nsight Compute on one attend_rope_d128 launch of the
# 27B's decode (full set, per-instruction stalls, boost clocks).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
G=.gpu/tandem-g; B=.gpu/tandem-b2; NCU=/usr/local/cuda/bin/ncu
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
$B synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf 2>&1 | tail -1
echo "synth 27b done $(( $(date +%s)-T0 )) s"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { echo "$1 g27 $($2 bench -m $W/g27.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama g27 $($LB -m $W/g27.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ tg g $G; tg b2 $B; lt; tg b2 $B; tg g $G; } > $OUT/tg27.txt 2>&1
echo "tg done $(( $(date +%s)-T0 )) s"; cat $OUT/tg27.txt
if [ $(( $(date +%s)-T0 )) -lt 400 ]; then
  timeout 150 $NCU -k "regex:^attend_rope_d128\$" --launch-skip 1240 --launch-count 1 --set full --clock-control none --import-source no -o $W/ar -f $B bench -m $W/g27.gguf --device cuda -p 0 -n 40 -r 1 > $W/ar.log 2>&1; echo "ncu exit $? $(( $(date +%s)-T0 )) s"
  $NCU -i $W/ar.ncu-rep --page details --print-details all > $OUT/attend_rope-details.txt 2>&1
  $NCU -i $W/ar.ncu-rep --page source --csv --print-source sass > $W/ar-sass.csv 2>&1
  python3 docs/gpu-runs/2026-11-30-attn/stalls.py $W/ar-sass.csv > $OUT/attend_rope-stalls.txt 2>&1
  grep -E "^ +(Duration|Elapsed Cycles|SM Active Cycles|SM Frequency|Registers Per|Warp Cycles Per Issued|Executed Ipc A)" $OUT/attend_rope-details.txt | head -8; head -40 $OUT/attend_rope-stalls.txt | cut -c1-150
fi
echo "total $(( $(date +%s)-T0 )) s"
