#!/usr/bin/env bash
# Call f4: the Gemma-3-27B-shaped Q4_K_M on main's kernels (binary m1, 9e3a682: the tied output head
# on the integer route, never timed on the 27B before): tg128 A B B A against llama-bench, then a1's
# kernel timeline on the same file if time is left.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-m1
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
echo "synth start $(date +%T)"
$N synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf 2>&1 | tail -1
echo "synth done $(date +%T)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { echo "tandem g27 $($N bench -m $W/g27.gguf --device cuda -p 0 -n 128 -r 3 $1 2>>$OUT/bench.err | grep -v '^gpu:' | tee -a $OUT/bench-v.txt | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama g27 $($LB -m $W/g27.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ tg -v; lt; lt; tg; } > $OUT/tg.txt 2>&1
grep "decode kernel\|tied\|GPU memory" $OUT/bench.err | sort -u > $OUT/choices.txt
echo "done $(date +%T)"; cat $OUT/tg.txt
TANDEM_CUDA_TRACE=$OUT/trace-g27.tsv timeout 60 .gpu/tandem-a1 bench -m $W/g27.gguf --device cuda -p 0 -n 128 -r 1 2>>$OUT/trace.err | grep tg128
python3 scripts/trace_summary.py $OUT/trace-g27.tsv --window-ms 500 > $OUT/summary-g27.md 2>&1; gzip $OUT/trace-g27.tsv; head -14 $OUT/summary-g27.md
