#!/usr/bin/env bash
# Call b5: b5 = main (b2) plus both attention kernels reading their placement, position and cache row
# (host-written parameters) before their wait, against b2. gpu-check b5 on gemma3-270m and the 8B
# Q4_K_M + Q8_0 (hashes at 600); tg128 b2 b5 b5 b2 on Q4_K_M and Q8_0 (six repetitions each); b5's
# timeline on Q8_0.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-b2; B=.gpu/tandem-b5
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P4=$!
( $B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 100 $B gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$OUT/check-g.err; echo "check g exit $? $(date +%T)"
wait $P4 $P8; echo "8b synth done $(date +%T)"
timeout 150 $B gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$OUT/check-8b.err; echo "check 8b exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 6 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for m in q4 q8; do tg b2 $A $m; tg b5 $B $m; tg b5 $B $m; tg b2 $A $m; done; } > $OUT/tg.txt 2>&1
echo "tg done $(date +%T), $(( $(date +%s)-T0 )) s"
TANDEM_CUDA_TRACE=$W/trace.tsv timeout 40 $B bench -m $W/q8.gguf --device cuda -p 0 -n 128 -r 1 2>>$OUT/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv > $OUT/timeline-b5-q8.md 2>&1
for f in check-g check-8b; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-240; grep -c "| yes |" $OUT/$f.md; grep "sha256\|greedy\|replay" $OUT/$f.md | cut -c1-240; done
head -14 $OUT/timeline-b5-q8.md | cut -c1-110; cat $OUT/tg.txt; echo "total $(( $(date +%s)-T0 )) s"
