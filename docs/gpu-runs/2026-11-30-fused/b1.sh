#!/usr/bin/env bash
# Call b1: RoPE + KV store fused into the decode attention kernel (b1 = main + attend_rope_d*) against
# g (c09da2e, the attention session's tree). gpu-check b1 on gemma3-270m and the 8B Q4_K_M + Q8_0
# (hashes at 600; they must equal the attention session's); tg128 g b1 b1 g on Q4_K_M and Q8_0;
# b1's kernel timeline on Q8_0.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
G=.gpu/tandem-g; B=.gpu/tandem-b1
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P4=$!
( $B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 100 $B gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$OUT/check-g.err; echo "check g exit $? $(date +%T)"
wait $P4 $P8; echo "8b synth done $(date +%T)"
timeout 150 $B gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$OUT/check-8b.err; echo "check 8b exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for m in q4 q8; do tg g $G $m; tg b1 $B $m; tg b1 $B $m; tg g $G $m; done; } > $OUT/tg.txt 2>&1
echo "tg done $(date +%T), $(( $(date +%s)-T0 )) s"
TANDEM_CUDA_TRACE=$W/trace-b1.tsv timeout 40 $B bench -m $W/q8.gguf --device cuda -p 0 -n 128 -r 1 2>>$OUT/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace-b1.tsv > $OUT/timeline-b1-q8.md 2>&1
for f in check-g check-8b; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-240; grep -c "| yes |" $OUT/$f.md; grep "sha256\|greedy\|replay\|fused" $OUT/$f.md | cut -c1-240; done
head -22 $OUT/timeline-b1-q8.md | cut -c1-110; cat $OUT/tg.txt; echo "total $(( $(date +%s)-T0 )) s"
