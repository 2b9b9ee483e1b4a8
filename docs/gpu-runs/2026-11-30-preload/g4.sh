#!/usr/bin/env bash
# Call g4: why --deterministic decodes faster than the default mode (call g3: tg128 540 against 534).
# h1 again. The decode kernel choices of both modes (-v), then tg128 A B B A on the 8B Q4_K_M and
# Q8_0: default, deterministic, and default with the integer variants limited to one-warp rows
# (TANDEM_CUDA_MMVQ: the split-1 labels deterministic mode may take).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-h1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf > $W/synth8.log 2>&1 &
SP=$!
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth q4 done $(el)"
for mode in default deterministic; do
  $B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v $([ $mode = deterministic ] && echo --deterministic) > $OUT/verbose-q4-$mode.txt 2>&1
  grep -i "decode kernel\|group\|cublas" $OUT/verbose-q4-$mode.txt | sort | uniq -c > $OUT/choices-q4-$mode.txt; done
diff $OUT/choices-q4-default.txt $OUT/choices-q4-deterministic.txt; echo "choices $(el)"
S1=u1r1s1,u2r1s1,u4r1s1,u1r2s1,u2r2s1,u8r1s1,u1r1s1p,u2r1s1p,u4r1s1p,u1r2s1p,u2r2s1p
tg() { echo "$1 $2 $(env $3 $B bench -m $W/$2.gguf --device cuda $4 -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg default q4 "" ""; tg det q4 "" --deterministic; tg split1 q4 TANDEM_CUDA_MMVQ=$S1 ""; tg split1 q4 TANDEM_CUDA_MMVQ=$S1 ""; tg det q4 "" --deterministic; tg default q4 "" ""; echo "at $(el)"; } > $W/tg4.txt 2>&1; cat $W/tg4.txt >> $R; cat $W/tg4.txt
wait $SP; tail -1 $W/synth8.log; echo "synth q8 done $(el)"
for mode in default deterministic; do
  $B bench -m $W/q8.gguf --device cuda -p 0 -n 16 -r 1 -v $([ $mode = deterministic ] && echo --deterministic) > $OUT/verbose-q8-$mode.txt 2>&1
  grep -i "decode kernel\|group\|cublas" $OUT/verbose-q8-$mode.txt | sort | uniq -c > $OUT/choices-q8-$mode.txt; done
diff $OUT/choices-q8-default.txt $OUT/choices-q8-deterministic.txt
{ tg default q8 "" ""; tg det q8 "" --deterministic; tg det q8 "" --deterministic; tg default q8 "" ""; echo "at $(el)"; } > $W/tg8.txt 2>&1; cat $W/tg8.txt >> $R; cat $W/tg8.txt; tail -3 $W/bench.err
echo "total $(el)"
