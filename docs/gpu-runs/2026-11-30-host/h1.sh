#!/usr/bin/env bash
# Call h1: the 27B after 07cfebf (add + norm in registers up to 8192) A B B A against llama-bench and
# the binary before it (m1, 9e3a682); its timeline; the 8B Q4_K_M's host time per step
# (TANDEM_CUDA_PASS_TIMES) and Nsight Compute on attend_tiles and add_norm_to.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-h0; M=.gpu/tandem-m1; NCU=/usr/local/cuda/bin/ncu
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( s=$(date +%s); $N synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf > $OUT/synth27.log 2>&1; echo "synth 27b $(( $(date +%s)-s )) s" >> $OUT/synth27.log ) &
s=$(date +%s); $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth 8b q4 $(( $(date +%s)-s )) s"
TANDEM_CUDA_PASS_TIMES=1 $N bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 2 2> $OUT/pass-times-q4.txt | grep tg128
grep "^pass: 1 rows" $OUT/pass-times-q4.txt | tail -200 | awk '{e+=$5; g+=$8; w+=$11; n++} END {printf "q4 steps %d: enqueue %.3f gpu %.3f wall %.3f ms (means)\n", n, e/n, g/n, w/n}'
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --section SourceCounters"
run() { timeout 150 $NCU -k "regex:$1" --launch-skip $2 --launch-count 1 $S $N bench -m $W/q4.gguf --device cuda -p 0 -n 8 -r 1 > $OUT/ncu-$1.txt 2>&1; echo "ncu $1 exit $? $(date +%T)"; }
run attend_tiles 100
run add_norm_to 100
wait; cat $OUT/synth27.log | tail -2
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { echo "$1 g27 $($2 bench -m $W/g27.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama g27 $($LB -m $W/g27.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o csv 2>>$OUT/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ tg h0 $N; lt; tg m1 $M; tg m1 $M; lt; tg h0 $N; } > $OUT/tg27.txt 2>&1
echo "27b done $(date +%T)"
TANDEM_CUDA_TRACE=$OUT/trace-g27.tsv timeout 60 $N bench -m $W/g27.gguf --device cuda -p 0 -n 128 -r 1 2>>$OUT/trace.err | grep tg128
python3 scripts/trace_summary.py $OUT/trace-g27.tsv --window-ms 500 > $OUT/summary-g27.md 2>&1; gzip $OUT/trace-g27.tsv
for f in $OUT/ncu-*.txt; do echo "== $f"; grep -E "Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Grid Size|Block Size" $f | head -9; done | cut -c1-120
head -24 $OUT/summary-g27.md; cat $OUT/tg27.txt
